"""A MapState's reads and writes a batch at a time: requests sent back to back, answers read after.

PySpark's MapState sends a request to its state server and waits for the answer before it sends
the next one: a round trip per entry (with an entry per key, its read and write cost 380 us a key,
calibrated on this 2-core machine: benchmarks/results/archive/calibrate_defaults_before_sub_buckets.md
at revision 2790930).
The state server (TransformWithStateInPySparkStateServer) reads a request, answers it and reads
the next, so a batch's requests can be written back to back and their answers read after them;
the answers come in the requests' order. `CHUNK` requests go before their answers are read, which keeps either
side from blocking on a full socket: a chunk of reads is small requests (its answers, a few KB
each, wait in the server's socket until they are read), a chunk of writes gets answers of a few
bytes each.

This speaks PySpark's own framing and protobuf messages through its client's private members
(`_stateful_processor_api_client`, its socket file and serializers), checked against PySpark
4.3; where a PySpark lacks them the entries go one at a time through the public MapState API.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

CHUNK = 256


class BatchedMapState:
    """read / write / remove / entries callbacks for fissure.runtime.state.key_buckets.SubBucketStore over a
    MapState of `entry int` -> `value binary`."""

    def __init__(self, state) -> None:
        self._state = state
        client = getattr(state, "_mapStateClient", None)
        api = getattr(client, "_stateful_processor_api_client", None)
        needed = ("sockfile", "_receive_proto_message", "_serialize_to_bytes", "_deserialize_from_bytes")
        self._client, self._api = client, api
        self.pipelined = (api is not None and all(hasattr(api, name) for name in needed)
                          and hasattr(client, "user_key_schema") and hasattr(client, "value_schema")
                          and hasattr(state, "_stateName"))
        if self.pipelined:
            import pyspark.sql.streaming.proto.StateMessage_pb2 as messages
            from pyspark.serializers import write_int

            self._messages, self._write_int = messages, write_int

    def read(self, entries: Sequence[int]) -> list[bytes | None]:
        if not self.pipelined:
            return [self._one(self._state.getValue((entry,))) for entry in entries]
        messages, api = self._messages, self._api
        requests = [messages.MapStateCall(stateName=self._state._stateName, getValue=messages.GetValue(
            userKey=api._serialize_to_bytes(self._client.user_key_schema, (entry,)))) for entry in entries]
        values = []
        for status, error, value in self._exchange(requests):
            if status != 0:
                raise RuntimeError(f"state server: reading a map state entry failed: {error}")
            values.append(api._deserialize_from_bytes(value)[0] if value else None)
        return values

    def write(self, pairs: Sequence[tuple[int, bytes]]) -> None:
        if not self.pipelined:
            for entry, data in pairs:
                self._state.updateValue((entry,), (data,))
            return
        messages, api, client = self._messages, self._api, self._client
        requests = [messages.MapStateCall(stateName=self._state._stateName, updateValue=messages.UpdateValue(
            userKey=api._serialize_to_bytes(client.user_key_schema, (entry,)),
            value=api._serialize_to_bytes(client.value_schema, (data,)))) for entry, data in pairs]
        for status, error, _ in self._exchange(requests):
            if status != 0:
                raise RuntimeError(f"state server: writing a map state entry failed: {error}")

    def remove(self, entries: Sequence[int]) -> None:
        if not self.pipelined:
            for entry in entries:
                self._state.removeKey((entry,))
            return
        messages, api, client = self._messages, self._api, self._client
        requests = [messages.MapStateCall(stateName=self._state._stateName, removeKey=messages.RemoveKey(
            userKey=api._serialize_to_bytes(client.user_key_schema, (entry,)))) for entry in entries]
        for status, error, _ in self._exchange(requests):
            if status != 0:
                raise RuntimeError(f"state server: removing a map state entry failed: {error}")

    def entries(self) -> Iterator[tuple[int, bytes]]:
        """Every (entry, value) of the grouping key's map, through PySpark's own iterator (a few
        requests for the lot: it fetches them in Arrow batches)."""
        for (entry,), (value,) in self._state.iterator():
            yield entry, value

    def _exchange(self, calls: list) -> list[tuple[int, str, bytes]]:
        """Send the map state calls CHUNK at a time, each chunk back to back, and read their answers."""
        messages, sockfile, answers = self._messages, self._api.sockfile, []
        for start in range(0, len(calls), CHUNK):
            chunk = calls[start:start + CHUNK]
            for call in chunk:
                payload = messages.StateRequest(
                    stateVariableRequest=messages.StateVariableRequest(mapStateCall=call)).SerializeToString()
                self._write_int(0, sockfile)  # the message format's version, as PySpark writes it
                self._write_int(len(payload), sockfile)
                sockfile.write(payload)
            sockfile.flush()
            answers.extend(self._api._receive_proto_message() for _ in chunk)
        return answers

    @staticmethod
    def _one(stored) -> bytes | None:
        return stored[0] if stored is not None else None
