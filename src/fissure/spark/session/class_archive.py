"""A class-data-sharing (CDS) archive of the driver JVM's classes, so that Spark's JVM starts faster.

Spark's driver JVM loads and verifies some 10,000 classes from its jars at each start. A JVM
given a dynamic CDS archive (`-XX:SharedArchiveFile`, JDK 13+) maps the classes a former run
loaded instead. Measured on this project's 2-core machine under load from other work (one run
each way, twice): the session's start took 3.5-5.1 s with the archive against 6.2-8.5 s
without, and the first Spark job 1.1-1.9 s against 3.4-4.1 s.

A JVM crashes (SIGABRT) when the archive it maps is cut short, so an archive is only ever used
once it is whole and checked, and never while it is written:

- The first JVM of a setup (the Spark version, its jars, the `java` binary and the driver's JVM
  options make its fingerprint) writes its classes at exit (`-XX:ArchiveClassesAtExit`) to a
  file of its own, `spark-<fingerprint>-<token>.jsa.part`, beside which fissure notes the JVM's
  process id and class path (`.json`). One such candidate at a time per fingerprint.
- A later start promotes a candidate whose JVM has exited: a separate `java -Xshare:on
  -XX:+VerifySharedSpaces -version` maps it with the same class path and options and checks
  its regions' checksums (a cut file crashes that process with SIGBUS, not the run, its crash
  report kept out of the user's directory; one flipped byte fails the check: both tried by hand
  on a 159 MB archive, whose check passed in 1.2 s), and only
  then is it renamed, atomically, to
  `spark-<fingerprint>.jsa`, the one name a JVM is given. A candidate that fails is deleted.
- If a JVM does not start with the archive's options (a JVM without dynamic CDS, an archive
  damaged since), fissure starts it again without them and leaves archives alone for that
  fingerprint (`unsupported-<fingerprint>`; the archive is deleted).

The files live in `$FISSURE_JVM_ARCHIVE_DIR`, else `$XDG_CACHE_HOME/fissure/jvm`, else
`~/.cache/fissure/jvm`; `RunnerConfig(jvm_class_archive=False)` or FISSURE_JVM_ARCHIVE_DIR set
to an empty string turns it off. A JVM whose jars changed since the archive was made is refused
by the JVM's own class-path check and runs without it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

ARCHIVE_DIR_VARIABLE = "FISSURE_JVM_ARCHIVE_DIR"
JAVA_OPTIONS_SETTING = "spark.driver.extraJavaOptions"
# The JVM's notes about classes it cannot archive (thousands of lines at exit) stay out of the log.
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# A candidate without its note (its process died before fissure wrote it) is removed after this.
ORPHAN_AGE_S = 3600.0
# An archive of another setup (an earlier Spark or java: 150-160 MB each) unused this long is removed.
UNUSED_AGE_S = 30 * 86400.0
CHECK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ArchiveState:
    """What the archive directory holds for one fingerprint."""

    archive: str | None  # the checked archive, when there is one
    pending: bool  # a candidate is being written or waits for its JVM to exit
    unsupported: bool  # a JVM of this fingerprint did not start with archive options


@dataclass(frozen=True)
class ArchiveDecision:
    """The JVM options a start adds for the archive, and why."""

    options: str
    dumps: bool  # this JVM writes a candidate at exit
    reason: str


def decide(state: ArchiveState, candidate: str) -> ArchiveDecision:
    """Use the checked archive; else write a candidate unless one is under way; else nothing."""
    if state.unsupported:
        return ArchiveDecision("", False, "a JVM of this setup did not start with archive options")
    if state.archive is not None:
        return ArchiveDecision(f"-XX:SharedArchiveFile={state.archive} -Xshare:auto {QUIET_CDS}", False,
                               "maps the classes of the checked archive")
    if state.pending:
        return ArchiveDecision("", False, "another JVM's candidate archive is being written or checked")
    return ArchiveDecision(f"-XX:ArchiveClassesAtExit={candidate} {QUIET_CDS}", True,
                           "no archive yet: this JVM writes its classes at exit")


def archive_directory() -> str | None:
    """Where archives are kept (None: turned off by an empty FISSURE_JVM_ARCHIVE_DIR)."""
    given = os.environ.get(ARCHIVE_DIR_VARIABLE)
    if given is not None:
        return given or None
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "fissure", "jvm")


def java_executable() -> str | None:
    """The `java` Spark's launcher runs: $JAVA_HOME/bin/java, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def fingerprint(java: str, java_options: str) -> str:
    """The setup an archive belongs to: Spark's version and jars, the java binary, the JVM options."""
    import pyspark

    jars = os.path.realpath(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
    status = os.stat(java)
    text = "\n".join([pyspark.__version__, jars, str(os.stat(jars).st_mtime_ns), java, str(status.st_size),
                      str(status.st_mtime_ns), java_options])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(*paths: str) -> None:
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def check_archive(java: str, archive: str, class_path: str, java_options: str) -> bool:
    """Whether a JVM maps `archive` whole with this class path and these options (run apart, in a
    temporary directory that takes the crash report: a cut archive crashes that JVM with SIGBUS)."""
    with tempfile.TemporaryDirectory(prefix="fissure-archive-check-") as directory:
        command = [java, f"-XX:SharedArchiveFile={archive}", "-Xshare:on", "-XX:+VerifySharedSpaces",
                   f"-XX:ErrorFile={os.path.join(directory, 'hs_err_%p.log')}", "-XX:-CreateCoredumpOnCrash",
                   *shlex.split(java_options), "-cp", class_path, "-version"]
        try:
            done = subprocess.run(command, cwd=directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=CHECK_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return done.returncode == 0


class ClassArchive:
    """The archive files of one fingerprint in `directory`."""

    def __init__(self, directory: str, java: str, java_options: str, now=time.time) -> None:
        self.directory, self.java, self.java_options, self._now = directory, java, java_options, now
        self.key = fingerprint(java, java_options)
        self.archive = os.path.join(directory, f"spark-{self.key}.jsa")
        self.unsupported_marker = os.path.join(directory, f"unsupported-{self.key}")

    def _candidates(self) -> list[str]:
        return sorted(glob.glob(os.path.join(self.directory, f"spark-{self.key}-*.jsa.part")))

    def promote(self) -> None:
        """Check each candidate whose JVM has exited; rename the first good one to the archive."""
        for part in self._candidates():
            note = part.removesuffix(".part") + ".json"
            try:
                with open(note, encoding="utf-8") as handle:
                    noted = json.load(handle)
            except (OSError, ValueError):
                if self._now() - os.path.getmtime(part) > ORPHAN_AGE_S:
                    _remove(part)
                continue
            if _alive(int(noted.get("pid", 0))):
                continue
            if not os.path.exists(self.archive) and check_archive(self.java, part, noted.get("class_path", ""),
                                                                  self.java_options):
                os.replace(part, self.archive)
            _remove(part, note)
        for note in glob.glob(os.path.join(self.directory, f"spark-{self.key}-*.jsa.json")):
            try:
                with open(note, encoding="utf-8") as handle:
                    pid = int(json.load(handle).get("pid", 0))
            except (OSError, ValueError):
                pid = 0
            if not _alive(pid) and not os.path.exists(note.removesuffix(".json") + ".part"):
                _remove(note)  # its JVM exited without writing (killed, or nothing to write)

    def forget_unused(self) -> None:
        """Remove the archives of other setups that no start has used for UNUSED_AGE_S."""
        for other in glob.glob(os.path.join(self.directory, "spark-*.jsa")):
            if other != self.archive and self._now() - os.path.getmtime(other) > UNUSED_AGE_S:
                _remove(other)

    def mark_used(self) -> None:
        """The archive's modification time is its last use (what `forget_unused` goes by)."""
        try:
            os.utime(self.archive)
        except OSError:  # another user's archive: used all the same
            pass

    def state(self) -> ArchiveState:
        notes = glob.glob(os.path.join(self.directory, f"spark-{self.key}-*.jsa.json"))
        return ArchiveState(archive=self.archive if os.path.exists(self.archive) else None,
                            pending=bool(self._candidates() or notes),
                            unsupported=os.path.exists(self.unsupported_marker))

    def new_candidate(self) -> str:
        return os.path.join(self.directory, f"spark-{self.key}-{secrets.token_hex(4)}.jsa.part")

    def note_candidate(self, candidate: str, pid: int, class_path: str) -> None:
        """Beside a candidate, the process writing it and its class path (written atomically)."""
        note = candidate.removesuffix(".part") + ".json"
        temporary = note + ".tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"pid": pid, "class_path": class_path}, handle)
        os.replace(temporary, note)

    def give_up(self) -> None:
        """A JVM did not start with archive options: none for this fingerprint from now on."""
        _remove(self.archive)
        with open(self.unsupported_marker, "w", encoding="utf-8") as handle:
            handle.write("a JVM did not start with class-data-sharing archive options\n")


def prepared_archive(java_options: str) -> tuple[ClassArchive | None, ArchiveDecision | None, str | None]:
    """The archive files, the decision for this start and the candidate it may write (Nones:
    no archive directory, no java found, or the directory cannot be written)."""
    directory, java = archive_directory(), java_executable()
    if directory is None or java is None:
        return None, None, None
    try:
        os.makedirs(directory, exist_ok=True)
        archive = ClassArchive(directory, java, java_options)
        archive.promote()
        archive.forget_unused()
        candidate = archive.new_candidate()
        decision = decide(archive.state(), candidate)
        if decision.options and not decision.dumps:
            archive.mark_used()
        return archive, decision, candidate
    except OSError:
        return None, None, None
