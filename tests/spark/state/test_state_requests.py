"""Batched MapState requests against PySpark's own state client, with a state server in the test
that answers as Spark's does (length-prefixed protobuf, one answer per request, in order)."""

import pickle
import socket
import struct
import threading

import pytest

pytest.importorskip("pyspark")

import pyspark.sql.streaming.proto.StateMessage_pb2 as messages  # noqa: E402
from pyspark.sql.streaming.map_state_client import MapStateClient  # noqa: E402
from pyspark.sql.streaming.stateful_processor import MapState  # noqa: E402
from pyspark.sql.streaming.stateful_processor_api_client import StatefulProcessorApiClient  # noqa: E402
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType  # noqa: E402

from fissure.spark.state import requests as state_requests  # noqa: E402
from fissure.spark.state.requests import BatchedMapState  # noqa: E402


class FakeStateServer:
    """A map state server: reads one request, answers it, reads the next, as Spark's does."""

    def __init__(self) -> None:
        self.entries: dict[int, bytes] = {}
        self.requests = 0
        self._listener = socket.create_server(("localhost", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        connection, _ = self._listener.accept()
        stream = connection.makefile("rwb")
        while True:
            header = stream.read(8)
            if len(header) < 8:
                return
            _, length = struct.unpack(">ii", header)
            request = messages.StateRequest()
            request.ParseFromString(stream.read(length))
            call = request.stateVariableRequest.mapStateCall
            self.requests += 1
            response = messages.StateResponse(statusCode=0)
            if call.HasField("getValue"):
                (entry,) = pickle.loads(call.getValue.userKey)
                if entry in self.entries:
                    response.value = pickle.dumps((self.entries[entry],))
            elif call.HasField("updateValue"):
                (entry,) = pickle.loads(call.updateValue.userKey)
                (self.entries[entry],) = pickle.loads(call.updateValue.value)
            else:
                response = messages.StateResponse(statusCode=1, errorMessage="unexpected call")
            payload = response.SerializeToString()
            stream.write(struct.pack(">i", len(payload)) + payload)
            stream.flush()


def map_state(server: FakeStateServer) -> MapState:
    api = StatefulProcessorApiClient(server.port, StructType([StructField("k", IntegerType())]))
    entry, value = StructType([StructField("entry", IntegerType())]), StructType([StructField("value", BinaryType())])
    return MapState(MapStateClient(api, entry, value), "fissure_key_buckets")


def test_batched_requests_go_through_pysparks_client_and_come_back_in_order():
    server = FakeStateServer()
    batched = BatchedMapState(map_state(server))
    assert batched.pipelined  # this PySpark's client has what the batching speaks
    entries = list(range(-1, 2 * state_requests.CHUNK + 7))  # more than two chunks
    batched.write([(entry, f"value {entry}".encode() * (entry % 50)) for entry in entries])
    assert server.entries == {entry: f"value {entry}".encode() * (entry % 50) for entry in entries}
    wanted = [5, 9_999, -1, 3, 10_000, 2 * state_requests.CHUNK]
    assert batched.read(wanted) == [server.entries.get(entry) for entry in wanted]
    assert server.requests == len(entries) + len(wanted)


def test_without_pysparks_private_client_entries_go_one_at_a_time_through_the_public_api():
    class PublicOnly:
        def __init__(self) -> None:
            self.entries: dict[tuple, tuple] = {}

        def getValue(self, key):  # noqa: N802 - PySpark's name
            return self.entries.get(key)

        def updateValue(self, key, value):  # noqa: N802 - PySpark's name
            self.entries[key] = value

    state = PublicOnly()
    batched = BatchedMapState(state)
    assert not batched.pipelined
    batched.write([(1, b"a"), (2, b"b")])
    assert state.entries == {(1,): (b"a",), (2,): (b"b",)}
    assert batched.read([2, 3, 1]) == [b"b", None, b"a"]
