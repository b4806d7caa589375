"""One SparkSession for the whole test run (local[2], UI off, small shuffles, fast JVM start)."""

from __future__ import annotations

import os
import sys

import pytest


def pytest_sessionstart(session):
    # Spark daemons a killed earlier test run left behind (tests/spark_cluster_support.py).
    from spark_cluster_support import reap_leftovers

    reap_leftovers()


def pytest_collection_modifyitems(config, items):
    """With tests spread over processes (./dev test: pytest-xdist, --dist loadgroup, the next test
    or xdist_group to the process that is free, in this order), the slow tests go first, then the
    other Spark tests (marked, or taking the `spark` fixture): the longest start early and the
    short ones fill the end, so no process is left running one long test while the other has
    nothing to do. In one process the order stays the files' order."""
    if not hasattr(config, "workerinput"):  # collected by an xdist worker process
        return
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow")
               else 1 if item.get_closest_marker("spark") or "spark" in item.fixturenames else 2)


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from fissure.config import RunnerConfig
    from fissure.spark.session.create import create_session

    from fissure.spark.session.stage_log import STAGE_LOG_CONF

    # The UI serves the REST API that tests/spark/session/test_stage_log.py reads.
    session = create_session(RunnerConfig(master="local[2]", app_name="fissure-tests", spark_conf=STAGE_LOG_CONF))
    yield session
    session.stop()
