"""In local mode every endpoint of the session fissure creates listens on loopback: the driver's
RPC and block manager, and the web UI (the test session runs it, for tests/spark/session/test_stage_log.py)."""

from __future__ import annotations

import ipaddress
import os

import pytest

from fissure.config import RunnerConfig
from fissure.spark.session.create import session_settings

pytestmark = pytest.mark.spark

LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp


def listening_addresses(pid: int) -> list[str]:
    """The local addresses of the TCP sockets process `pid` listens on (from /proc)."""
    inodes = set()
    for descriptor in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    addresses = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        if not os.path.exists(table):
            continue
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == LISTEN and fields[9] in inodes:
                    addresses.append(_address(fields[1].split(":")[0], width))
    return addresses


def _address(hex_address: str, width: int) -> str:
    """/proc/net/tcp's address: 32-bit words in the machine's (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[index:index + 4][::-1] for index in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def test_local_mode_settings_bind_loopback_and_turn_the_kill_links_off():
    settings = session_settings(RunnerConfig(master="local[2]"))
    assert settings["spark.driver.bindAddress"] == settings["spark.driver.host"] == "127.0.0.1"
    assert settings["spark.ui.killEnabled"] == "false"
    # On a cluster the executors must reach the driver: Spark's choice stands.
    assert "spark.driver.bindAddress" not in session_settings(RunnerConfig(master="spark://head:7077"))
    # The caller's own settings win.
    assert session_settings(RunnerConfig(spark_conf={"spark.driver.host": "10.0.0.5"}))["spark.driver.host"] == "10.0.0.5"


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the sockets from Linux's /proc")
def test_every_endpoint_of_a_local_session_listens_on_loopback(spark):
    from pyspark import SparkContext

    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert conf.get("spark.ui.killEnabled") == "false"
    assert spark.sparkContext.uiWebUrl is not None  # the test session runs the UI: its socket is checked too
    jvm = SparkContext._gateway.proc.pid
    addresses = listening_addresses(jvm)
    # py4j's gateway, the driver's RPC, the block manager and the UI at least.
    assert len(addresses) >= 4, addresses
    assert all(ipaddress.ip_address(address).is_loopback for address in addresses), addresses
