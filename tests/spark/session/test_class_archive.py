"""The driver JVM's class archive: used only once whole and checked, never while written, and a
JVM that does not start with it starts without it."""

from __future__ import annotations

import os

import pytest

from fissure.spark.session import class_archive, jvm
from fissure.spark.session.class_archive import ArchiveState, ClassArchive, decide, java_executable


def test_the_checked_archive_is_used_else_one_candidate_at_a_time_is_written():
    used = decide(ArchiveState(archive="/c/spark-k.jsa", pending=True, unsupported=False), "/c/new.part")
    assert used.options.startswith("-XX:SharedArchiveFile=/c/spark-k.jsa -Xshare:auto") and not used.dumps
    written = decide(ArchiveState(archive=None, pending=False, unsupported=False), "/c/new.part")
    assert "-XX:ArchiveClassesAtExit=/c/new.part" in written.options and written.dumps
    waiting = decide(ArchiveState(archive=None, pending=True, unsupported=False), "/c/new.part")
    assert waiting.options == "" and not waiting.dumps
    refused = decide(ArchiveState(archive="/c/spark-k.jsa", pending=False, unsupported=True), "/c/new.part")
    assert refused.options == "" and "did not start" in refused.reason


def _archive(tmp_path) -> ClassArchive:
    java = tmp_path / "java"
    java.write_text("")
    return ClassArchive(str(tmp_path), str(java), "-XX:+UseSerialGC")


def _candidate(archive: ClassArchive, pid: int, content: bytes = b"classes") -> str:
    part = archive.new_candidate()
    with open(part, "wb") as handle:
        handle.write(content)
    archive.note_candidate(part, pid, "/jars/a.jar")
    return part


def test_a_candidate_whose_jvm_still_runs_is_left_alone(tmp_path, monkeypatch):
    archive = _archive(tmp_path)
    checked = []
    monkeypatch.setattr(class_archive, "check_archive", lambda *args: checked.append(args) or True)
    part = _candidate(archive, os.getpid())  # this process: alive
    archive.promote()
    assert os.path.exists(part) and checked == []
    assert archive.state() == ArchiveState(archive=None, pending=True, unsupported=False)


def test_a_finished_candidate_becomes_the_archive_only_when_its_check_passes(tmp_path, monkeypatch):
    archive = _archive(tmp_path)
    dead_pid = 2 ** 22 + 12345  # above the kernel's pid_max: no such process
    monkeypatch.setattr(class_archive, "check_archive", lambda *args: False)
    part = _candidate(archive, dead_pid)
    archive.promote()
    assert not os.path.exists(part) and not os.path.exists(archive.archive)
    assert archive.state() == ArchiveState(archive=None, pending=False, unsupported=False)

    seen = []
    monkeypatch.setattr(class_archive, "check_archive",
                        lambda java, path, class_path, options: seen.append((path, class_path, options)) or True)
    part = _candidate(archive, dead_pid, b"whole")
    archive.promote()
    assert seen == [(part, "/jars/a.jar", "-XX:+UseSerialGC")]
    with open(archive.archive, "rb") as handle:
        assert handle.read() == b"whole"
    assert sorted(os.listdir(tmp_path)) == sorted(["java", os.path.basename(archive.archive)])


@pytest.mark.skipif(java_executable() is None, reason="no java")
def test_a_cut_archive_fails_its_check_in_a_process_of_its_own(tmp_path, monkeypatch):
    cut = tmp_path / "cut.jsa"
    cut.write_bytes(b"\xa8\xba\x0b\xf0" + b"\0" * 4096)  # a dynamic archive's magic, then nothing whole
    monkeypatch.chdir(tmp_path)
    assert class_archive.check_archive(java_executable(), str(cut), "/nowhere.jar", "-XX:+UseSerialGC") is False
    assert sorted(os.listdir(tmp_path)) == ["cut.jsa"]  # no crash report left where the run was started


def _launches(monkeypatch, fails_with_options: bool, fails_without: bool) -> list[str]:
    options_seen = []

    def launch(conf, popen_kwargs):
        options = conf.get(class_archive.JAVA_OPTIONS_SETTING)
        options_seen.append(options)
        if ("-XX:" + "ArchiveClassesAtExit" in options and fails_with_options) or fails_without:
            raise RuntimeError("Java gateway process exited before sending its port number")
        return "gateway"

    monkeypatch.setattr("pyspark.java_gateway.launch_gateway", launch)
    return options_seen


def _launch(tmp_path):
    from pyspark import SparkConf

    conf = SparkConf(loadDefaults=False).set(class_archive.JAVA_OPTIONS_SETTING, "-XX:+UseSerialGC")
    with open(tmp_path / "spark.log", "ab") as log:
        return jvm._launch_with_archive(conf, {class_archive.JAVA_OPTIONS_SETTING: "-XX:+UseSerialGC"}, log)


def _markers(tmp_path) -> list[str]:
    return [name for name in os.listdir(tmp_path / "jvm") if name.startswith("unsupported-")]


def test_a_jvm_that_does_not_start_with_the_archive_starts_without_it(tmp_path, monkeypatch):
    monkeypatch.setenv(class_archive.ARCHIVE_DIR_VARIABLE, str(tmp_path / "jvm"))
    options_seen = _launches(monkeypatch, fails_with_options=True, fails_without=False)
    assert _launch(tmp_path) == "gateway"
    assert "-XX:ArchiveClassesAtExit=" in options_seen[0] and options_seen[1] == "-XX:+UseSerialGC"
    assert len(_markers(tmp_path)) == 1  # no archive options for this setup from now on
    assert "did not start" in (tmp_path / "spark.log").read_text()


def test_a_jvm_that_starts_neither_way_raises_and_keeps_the_archive_for_later(tmp_path, monkeypatch):
    monkeypatch.setenv(class_archive.ARCHIVE_DIR_VARIABLE, str(tmp_path / "jvm"))
    _launches(monkeypatch, fails_with_options=True, fails_without=True)
    with pytest.raises(RuntimeError, match="exited before"):
        _launch(tmp_path)
    assert _markers(tmp_path) == []


def test_an_empty_archive_directory_setting_turns_it_off(monkeypatch):
    monkeypatch.setenv(class_archive.ARCHIVE_DIR_VARIABLE, "")
    assert class_archive.prepared_archive("-XX:+UseSerialGC") == (None, None, None)


def test_archives_of_other_setups_unused_for_a_month_are_removed(tmp_path):
    archive = _archive(tmp_path)
    stale, recent = tmp_path / "spark-0000000000000000.jsa", tmp_path / "spark-1111111111111111.jsa"
    for path in (stale, recent):
        path.write_bytes(b"old")
    month_ago = os.path.getmtime(recent) - class_archive.UNUSED_AGE_S - 60
    os.utime(stale, (month_ago, month_ago))
    (tmp_path / os.path.basename(archive.archive)).write_bytes(b"mine")
    os.utime(archive.archive, (month_ago, month_ago))
    archive.forget_unused()
    assert not stale.exists() and recent.exists() and os.path.exists(archive.archive)
