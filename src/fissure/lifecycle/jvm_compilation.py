"""How the JVM of a session fissure creates compiles Spark's code (pure: the facts passed in).

HotSpot compiles hot code first with C1 (quick, plain code), then again with C2 (slower to
compile, code about twice as fast). C2's compiling costs CPU in the first tens of seconds, on the
cores the run needs. Measured on the 2-core machine (benchmarks/jvm_compilation.py, LogWatch,
1,000,000 lines, a fresh session each time): with C1 alone (`-XX:TieredStopAtLevel=1`) the
session's first run took 17.0-17.1 s, with C2 as well 20.2-21.0 s; the later runs of the same
session ran at 88,795-115,054 lines/s (median 102,614) with C1 alone and 100,798-119,690 (median
114,193) with C2, 11 % faster. `./dev example` reached its first output in 11.2-12.5 s with C1
alone and 14.3-15.9 s with C2 (docs/profiling.md). So a run that ends soon gets C1 alone, and one
that runs long the full compilation: a stream that waits for more input (it runs until stopped),
or a run that reads its input once when that input holds at least `LONG_RUN_RECORDS` records
(about where the 11 % wins back the 3-4 s C2 costs at the start, at LogWatch's rates).
"""

from __future__ import annotations

from dataclasses import dataclass

# C1 alone: HotSpot's tiered compilation stopped at its first compiler.
QUICK_START_OPTION = "-XX:TieredStopAtLevel=1"
# A run that reads its input once runs long from about this many records (the module docstring).
LONG_RUN_RECORDS = 5_000_000


@dataclass(frozen=True)
class JvmCompilation:
    """Whether the session's JVM compiles with C2 as well as C1, and why."""

    full: bool
    reason: str

    def java_options(self, others: str) -> str:
        """The driver's Java options: `others` with C1 alone unless the compilation is full."""
        options = [option for option in others.split() if not option.startswith("-XX:TieredStopAtLevel")]
        return " ".join(options if self.full else [QUICK_START_OPTION, *options])


def choose_jvm_compilation(*, reads_once: bool, input_records: float | None) -> JvmCompilation:
    """`reads_once`: the run ends when its input is read (available_now); `input_records`: that
    input, when fissure can count it (local files), else None."""
    if not reads_once:
        return JvmCompilation(True, "a stream that waits for more input runs long: C1 and C2")
    if input_records is not None and input_records >= LONG_RUN_RECORDS:
        return JvmCompilation(True, f"about {input_records:,.0f} records to read, at least {LONG_RUN_RECORDS:,}:"
                                    f" a long run, C1 and C2")
    if input_records is None:
        return JvmCompilation(False, "an input read once that fissure cannot count (not local files):"
                                     " C1 alone for a quick start")
    return JvmCompilation(False, f"about {input_records:,.0f} records read once, fewer than {LONG_RUN_RECORDS:,}:"
                                 f" a run that ends soon, C1 alone for a quick start")
