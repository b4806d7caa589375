"""The CPU time of a program's Spark-side Python functions, in this process, per input line.

What Spark's Python workers spend on one micro-batch, without Spark: the program (the aggregate
word count of benchmarks/cost.py, or its running count per occurrence; Nexmark's hot items up
to its first keyed stage, whose bids are the lines here; or LogWatch over generated log lines) is
compiled against a
stand-in DataFrame that keeps the functions `compile_graph` ships (each `mapInArrow` function and
each keyed stage's state processor), and they are called here on the Arrow batches Spark would
hand them: the micro-batch's lines (Zipf over 10,000 words, 10,000 rows an Arrow batch) split over
two tasks, each stage's output fed to the next, a keyed stage's packed rows grouped by key as the
exchange groups them, its state in a dictionary in place of Spark's state store. The first
micro-batch writes the states; each repeat then times the second, one stage at a time, with
`time.process_time` (CPU time: robust on a machine shared with other work, where wall time is
not). Spark's own part (reading, Arrow transfer, shuffles, the state store, the driver) is not in
it: docs/profiling.md, "What a record costs, part by part", measures that.

    ./dev python benchmarks/worker_cpu.py [--lines 100000] [--repeats 5] [--variant aggregate|running|hot-items|logwatch]
    ./dev python benchmarks/worker_cpu.py --profile tottime   # one batch under cProfile instead

Results: worker_cpu_VARIANT.md/.json under --out (benchmarks/results/ keeps worker_cpu_logwatch),
with the direct loop's CPU time over the same lines beside the stages (not for hot items, whose
stages here stop before its keyed ones).
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import pyarrow as pa  # noqa: E402

import direct_loops  # noqa: E402
import method  # noqa: E402
from fissure.runtime.state.grouping_keys import spark_partition  # noqa: E402

ARROW_BATCH_ROWS = 10_000
TASKS = 2


class _Accumulator:
    def add(self, value) -> None:
        pass


class _Grouped:
    def __init__(self, frame) -> None:
        self.frame = frame

    def transformWithStateInPandas(self, processor, *args, **kwargs):  # noqa: N802 - Spark's name
        self.frame.captured.append(("state", processor))
        return self.frame


class _Frame:
    """Stands in for a streaming DataFrame of a text source: keeps what compile_graph ships."""

    def __init__(self) -> None:
        from pyspark.sql.types import StringType, StructField, StructType

        self.schema = StructType([StructField("value", StringType())])
        self.captured: list[tuple[str, object]] = []

    def mapInArrow(self, function, schema, **kwargs):  # noqa: N802 - Spark's name
        self.captured.append(("arrow", function))
        return self

    def repartition(self, *args):
        return self

    def withColumn(self, *args):  # noqa: N802
        return self

    def unionByName(self, other):  # noqa: N802
        return self

    def groupBy(self, *args):  # noqa: N802
        return _Grouped(self)


class _Task:
    def __init__(self, partition: int) -> None:
        self.partition = partition

    def partitionId(self) -> int:  # noqa: N802
        return self.partition

    def getLocalProperty(self, name):  # noqa: N802
        return None

    def taskAttemptId(self) -> int:  # noqa: N802
        return self.partition


class _MapState:
    def __init__(self) -> None:
        self.data: dict = {}

    def getValue(self, key):  # noqa: N802
        value = self.data.get(key[0])
        return None if value is None else (value,)

    def updateValue(self, key, value) -> None:  # noqa: N802
        self.data[key[0]] = value[0]

    def removeKey(self, key) -> None:  # noqa: N802
        self.data.pop(key[0], None)

    def iterator(self):
        return iter([((key,), (value,)) for key, value in list(self.data.items())])


class _ValueState:
    def __init__(self) -> None:
        self.value = None

    def get(self):
        return self.value

    def update(self, value) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class WorkerStages:
    """The compiled program's worker functions, run one micro-batch at a time."""

    def __init__(self, program, before_keyed_stages: bool = False) -> None:
        import pyspark

        from fissure.plan.plans import planner_plan
        from fissure.program.graph import as_graph
        from fissure.spark.query.compile_graph import compile_graph
        from fissure.spark.query.stages import WorkerProfiling

        graph = as_graph(program)
        frame = _Frame()
        compile_graph(graph, {graph.sources[0]: frame}, plan=planner_plan(program, TASKS),
                      profiling=WorkerProfiling(_Accumulator()))
        captured = frame.captured
        if before_keyed_stages:  # the stages before the first keyed stage only
            kinds = [kind for kind, _ in captured]
            captured = captured[:kinds.index("state")] if "state" in kinds else captured
        self.stages = captured  # ("arrow", mapInArrow function) or ("state", state processor), in query order
        self.task = [_Task(0)]
        pyspark.TaskContext.get = classmethod(lambda cls: self.task[0])
        self.handlers: dict = {}
        self.states: dict = {}

    def run(self, lines: list[str], spent: dict[str, list[float]] | None = None) -> None:
        """One micro-batch of `lines` through the stages in query order, each stage's output the
        next one's input; each stage's CPU seconds appended to `spent`."""
        share = -(-len(lines) // TASKS)
        inputs = [[pa.RecordBatch.from_pydict({"value": part[start:start + ARROW_BATCH_ROWS]})
                   for start in range(0, len(part), ARROW_BATCH_ROWS)]
                  for part in (lines[task * share:(task + 1) * share] for task in range(TASKS))]
        arrow_stages = state_stages = 0
        for kind, stage in self.stages:
            if kind == "arrow":
                started_s, outputs = time.process_time(), []
                for task, batches in enumerate(inputs):
                    self.task[0] = _Task(task)
                    outputs.append([batch for batch in stage(iter(batches)) if batch.num_rows])
                self._note(spent, f"pe stage {arrow_stages}: {type(getattr(stage, 'function', stage)).__name__}",
                           started_s)
                arrow_stages += 1
            else:
                outputs = self._keyed_stage(state_stages, stage, inputs, spent)
                state_stages += 1
            inputs = outputs

    def _keyed_stage(self, position: int, light, inputs, spent) -> list[list[pa.RecordBatch]]:
        """The exchange groups the packed rows by key (each key on the task Spark's hash gives it,
        its state in a dictionary); the handler's output per task, as Arrow batches."""
        batches = [batch for task in inputs for batch in task]
        outputs: list[list[pa.RecordBatch]] = [[] for _ in range(TASKS)]
        if not batches:
            return outputs
        rows = pa.Table.from_batches(batches).to_pandas()
        started_s = time.process_time()
        for key, group in rows.groupby(rows.columns[0], sort=True):
            task = spark_partition(int(key), TASKS)  # the task Spark's hash exchange gives the key
            self.task[0] = _Task(task)
            handler = self.handlers.get((position, task))
            if handler is None:
                handler = self.handlers[(position, task)] = pickle.loads(light.payload)
            handler.attach(self.states.setdefault((position, key), {
                variable.name: _MapState() if variable.kind == "map" else _ValueState()
                for variable in light.variables}))
            for frame in handler.handleInputRows((key,), iter([group.reset_index(drop=True)]), None):
                if len(frame):
                    outputs[task].append(pa.RecordBatch.from_pandas(frame, preserve_index=False))
        self._note(spent, f"keyed stage {position}", started_s)
        return outputs

    @staticmethod
    def _note(spent, label: str, started_s: float) -> None:
        if spent is not None:
            spent.setdefault(label, []).append(time.process_time() - started_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=100_000, help="lines a micro-batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant", choices=("aggregate", "running", "hot-items", "logwatch"), default="aggregate",
                        help="the word count's aggregate or running count, Nexmark's hot items (its stages "
                             "before the first keyed one: its keyed stages need a micro-batch's clock, which "
                             "the driver hands out on Spark), or LogWatch (examples/logwatch.py, generated lines)")
    parser.add_argument("--profile", metavar="SORT", help="run one batch under cProfile, sorted by SORT")
    method.add_arguments(parser, repeats=None, quick=False)
    args = parser.parse_args(argv)
    run = None if args.profile else method.Run("worker_cpu.py", argv, out=args.out, master=None)
    if args.variant == "hot-items":
        from generators.nexmark import bid_lines, generate_bids

        stages = WorkerStages(direct_loops.programs("hot-items")[""], before_keyed_stages=True)
        lines = list(bid_lines(generate_bids(2 * args.lines)))
    elif args.variant == "logwatch":
        from generators.loglines import generate as generate_log_lines

        stages = WorkerStages(direct_loops.programs("logwatch")[""])
        lines = list(generate_log_lines(2 * args.lines))
    else:
        from generators.words import generate

        stages = WorkerStages(direct_loops.programs("wordcount")["aggregate" if args.variant == "aggregate" else ""])
        lines = generate(2 * args.lines, vocabulary_size=10_000, fixed_length=True)
    first, steady = lines[:args.lines], lines[args.lines:]
    stages.run(first)
    if args.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile(time.process_time)
        profile.enable()
        stages.run(steady)
        profile.disable()
        pstats.Stats(profile).sort_stats(args.profile).print_stats(40)
        return 0
    spent: dict[str, list[float]] = {}
    direct: list[float] = []
    family = {"hot-items": None, "logwatch": "logwatch"}.get(args.variant, "wordcount")
    with method.scratch_folder("worker_cpu.py") as work:
        steady_file = work / "steady.txt"
        steady_file.write_text("".join(line.rstrip("\n") + "\n" for line in steady), encoding="utf-8")
        for _ in range(args.repeats):
            stages.run(steady, spent)
            if family is not None:  # hot items' stages here are not its whole program: no direct loop beside them
                started_s = time.process_time()
                direct_loops.DIRECT[family][0]([str(steady_file)])
                direct.append(time.process_time() - started_s)
    what = {"hot-items": "hot items, the stages before the first keyed one", "logwatch": "LogWatch"}.get(
        args.variant, f"{args.variant} word count")
    per_line = lambda seconds: 1e6 * seconds / args.lines  # noqa: E731
    lines_out = [f"# The Spark-side Python of {what}, in process", "",
                 f"A micro-batch of {args.lines:,} lines over {TASKS} tasks, after one that wrote the states; "
                 f"CPU µs a line (`time.process_time`), median of {args.repeats} repeats (each in the runs column).",
                 "", "| stage | CPU µs a line | runs |", "| --- | --- | --- |"]
    total = 0.0
    for label, values in spent.items():
        median = statistics.median(values)
        total += median
        lines_out.append(f"| {label} | {per_line(median):.2f} | "
                         + ", ".join(f"{per_line(value):.2f}" for value in values) + " |")
    lines_out.append(f"| total | {per_line(total):.2f} | |")
    document = {"variant": args.variant, "lines": args.lines, "repeats": args.repeats,
                "stages_cpu_s": spent, "total_us_per_line": per_line(total)}
    if direct:
        loop = statistics.median(direct)
        lines_out += ["", f"The direct loop (benchmarks/direct_loops.py) over the same lines on one thread, its "
                          f"state starting empty: {per_line(loop):.2f} µs a line (runs: "
                          + ", ".join(f"{per_line(value):.2f}" for value in direct) + f"); the stages' total is "
                          f"{total / loop:.2f}x it."]
        document.update(direct_cpu_s=direct, direct_us_per_line=per_line(loop), stages_over_direct=total / loop)
    run.write_results(f"worker_cpu_{args.variant}", "\n".join(lines_out), document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
