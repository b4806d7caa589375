"""The JVM's compilation for the session fissure creates: C1 alone for a run that ends soon, C1
and C2 for one that runs long (fissure.lifecycle.jvm_compilation), and its place in the session's settings."""

from __future__ import annotations

import pytest

from fissure.config import RunnerConfig
from fissure.lifecycle.jvm_compilation import (LONG_RUN_RECORDS, QUICK_START_OPTION, JvmCompilation,
                                               choose_jvm_compilation)


def test_a_stream_that_waits_for_more_input_gets_the_full_compilation_whatever_it_holds_now():
    assert choose_jvm_compilation(reads_once=False, input_records=10) == JvmCompilation(
        True, "a stream that waits for more input runs long: C1 and C2")


def test_an_input_read_once_gets_the_full_compilation_from_the_long_run_threshold_on():
    assert choose_jvm_compilation(reads_once=True, input_records=LONG_RUN_RECORDS) == JvmCompilation(
        True, "about 5,000,000 records to read, at least 5,000,000: a long run, C1 and C2")
    assert choose_jvm_compilation(reads_once=True, input_records=LONG_RUN_RECORDS - 1) == JvmCompilation(
        False, "about 4,999,999 records read once, fewer than 5,000,000: a run that ends soon, C1 alone for a "
               "quick start")


def test_an_input_fissure_cannot_count_keeps_the_quick_start():
    assert choose_jvm_compilation(reads_once=True, input_records=None) == JvmCompilation(
        False, "an input read once that fissure cannot count (not local files): C1 alone for a quick start")


def test_the_java_options_keep_the_others_and_stop_at_c1_only_for_a_quick_start():
    others = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    assert JvmCompilation(True, "long").java_options(others) == "-XX:+UseSerialGC"
    assert JvmCompilation(False, "short").java_options(others) == f"{QUICK_START_OPTION} -XX:+UseSerialGC"
    assert JvmCompilation(False, "short").java_options("-Xss4m") == f"{QUICK_START_OPTION} -Xss4m"


def test_the_session_settings_carry_the_compilation_unless_the_caller_sets_java_options():
    from fissure.spark.session.create import JAVA_OPTIONS, session_settings

    long_run, short_run = JvmCompilation(True, "long"), JvmCompilation(False, "short")
    assert session_settings(RunnerConfig(master="local[2]"))[JAVA_OPTIONS].startswith(QUICK_START_OPTION)
    assert QUICK_START_OPTION not in session_settings(RunnerConfig(master="local[2]"), long_run)[JAVA_OPTIONS]
    assert session_settings(RunnerConfig(master="local[2]"), short_run)[JAVA_OPTIONS].startswith(QUICK_START_OPTION)
    mine = RunnerConfig(master="local[2]", spark_conf={JAVA_OPTIONS: "-Xss4m"})
    assert session_settings(mine, long_run)[JAVA_OPTIONS] == "-Xss4m"


@pytest.mark.parametrize("available_now, large, full", [
    (True, False, False),  # a small input read once
    (True, True, True),  # an input of more than LONG_RUN_RECORDS records (by its bytes)
    (False, False, True),  # a stream: more may come
])
def test_a_run_counts_its_local_files_to_choose(tmp_path, available_now, large, full):
    from fissure.spark.io.sources import FileSource
    from fissure.spark.query.binding import run_compilation

    (tmp_path / "part-0.txt").write_text("".join(f"line {index}\n" for index in range(20)))
    if large:  # a sparse file: its size says 100 MB, about 13 million lines of the first file's length
        with open(tmp_path / "part-1.txt", "wb") as file:
            file.truncate(100 * 2**20)
    config = RunnerConfig(master="local[2]", available_now=available_now)
    assert run_compilation(config, {"lines": FileSource(str(tmp_path), format="text")}).full is full
