"""Every setting of a run, in one typed tree with its defaults and what each is for: the one
place to configure fissure (no pyspark here), whose every field is documented below and checked
when it is made (ValueError naming the field and what it takes).

    fissure.run(program, source, sink, plan="planner", checkpoint="ckpt/",
                config=RunnerConfig(timeout_s=60, replanning="adaptive",
                                    profiling=ProfileSettings(window_batches=10),
                                    adaptation=AdaptiveConfig(min_gain=0.1)))

The same settings as Spark-style keys, as spark-submit's `--conf` sets Spark's own: a field is
`spark.fissure.<field>`, a field of a nested tree `spark.fissure.<tree>.<field>`
(`spark.fissure.profiling.window_batches`), values as text (`true`/`false`, numbers, `none` for an
optional one, names separated by commas for a list):

    RunnerConfig.from_conf({"spark.fissure.replanning": "adaptive", "spark.fissure.timeout_s": "60"})
    fissure run app.py:build --source in/ --conf spark.fissure.replanning=off

A key outside spark.fissure. is Spark's own setting: it goes to `spark_conf`, for the session
fissure creates. A spark.fissure. key that names no setting is refused, naming the closest one.
Objects (the session, a dead-letter sink, estimates) are fields, not keys. `RunnerConfig.keys()`
lists every key with its default.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fissure.control.adaptive.config import AdaptiveConfig
from fissure.control.autopipeline_control import AutopipelineControlConfig
from fissure.lifecycle.failures import RestartPolicy
from fissure.lifecycle.progress import check_progress_mode
from fissure.control.thread_level.config import POLICY_NAMES, ElasticityConfig
from fissure.lifecycle.watchdog import StallPolicy
from fissure.model.state_buckets import check_bucket_count
from fissure.plan.autopipeline import DEFAULT_BETA
from fissure.profile.settings import ProfileSettings
from fissure.program.operators import OperatorEstimate
from fissure.runtime.state.codec import STATE_KEY_VARIABLE, StateAccess, state_key_from

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
REPLANNING = ("off", "adaptive", "autopipeline")  # RunnerConfig.replanning
CONF_PREFIX = "spark.fissure."


@dataclass(frozen=True)
class GraphAutopipelineConfig:
    """The autopipelining loop's parameters (fissure.spark.adaptive.autopipelining)."""

    profile_batches: int = 3  # micro-batches per measurement window
    beta: float = DEFAULT_BETA
    # settle_s 0: the window after an insertion already ran entirely under the new boundaries.
    control: AutopipelineControlConfig = field(default_factory=lambda: AutopipelineControlConfig(settle_s=0.0))

    def __post_init__(self) -> None:
        if self.profile_batches < 1:
            raise ValueError(f"profile_batches must be >= 1, got {self.profile_batches}")


@dataclass(frozen=True)
class RunnerConfig:
    """How fissure runs a program on Spark. Every field has a default that works out of the box."""

    # Master of the SparkSession fissure creates when the caller passes none (embedded default):
    # local mode on every core, each task tried up to 4 times (Spark's `local[N,F]` form; a plain
    # `local[N]` never retries a failed task). A master given here is used as given.
    master: str = "local[*,4]"
    # Restarts of the query on its checkpoint that `fissure.run` makes within any
    # `query_restart_window_s` seconds after a failure that is the machine's, not the program's
    # (fissure.lifecycle.failures): a Python worker process that died (a crash, a signal, the OOM
    # killer), an operator out of memory or of another resource (never a dead letter), a full
    # disk. Spark does not retry the tasks of a streaming query's pipelined stages (one attempt
    # each, measured on 4.3), so a transient failure would end the stream. Per window, not per
    # run: unrelated crashes spread over a long run all recover, a crash loop ends within the
    # window with its cause; the same record failing the same way after `query_restarts`
    # restarts ends the run naming it.
    query_restarts: int = 3
    query_restart_window_s: float = 600.0
    app_name: str = "fissure"
    # The streaming query's name in Spark (its web UI, `spark.streams`); None: unnamed. Spark lets
    # one active query in a session hold a name: a second one under it fails to start.
    query_name: str | None = None
    # Time between micro-batch starts; 0 starts the next batch as soon as the last one ends.
    trigger_interval_s: float = 0.0
    # Micro-batch size of a file source given none (FileSource's max_*_per_trigger; fissure run's
    # --kb-per-batch / --files-per-batch). "auto": from the Spark model of the plan in force, the
    # smallest batch whose fixed cost is at most `batch_fixed_share` of it, capped so a batch
    # takes at most `batch_latency_bound_s` (fissure.plan.batch_size); "all": every new file in
    # one batch, as Spark does. With `batch_sample_costs`, the model's operator costs are measured
    # first in the driver on the sources' first records (fissure.local.cost_sample; skipped when an
    # operator declares `waits=`, whose calls may reach outside systems); else the declared hints.
    # The sample runs the program's operators in a forked driver process at a checkpoint's first
    # start only (a line on stderr says so); later starts on it read the costs it kept. A run that
    # reads its sources once (available now) whose whole input fits in one batch even with
    # operators ten times costlier than declared takes no sample (its admission says so).
    batch_size: str = "auto"
    batch_fixed_share: float = 0.1
    batch_latency_bound_s: float | None = None
    batch_sample_costs: bool = True
    # How progress shows on stderr (fissure.lifecycle.progress): "auto" (a live line redrawn in
    # place on a terminal, timestamped lines elsewhere), "live", "lines" or "off".
    progress: str = "auto"
    # How often the runner looks at its query (and the live line is redrawn).
    progress_interval_s: float = 1.0
    # The lines form: at most one line per this many seconds, beside the first batch's, each plan
    # change's and the end's.
    progress_lines_interval_s: float = 10.0
    # The watchdog (fissure.lifecycle.watchdog): a micro-batch running `stall_factor` times longer
    # than the last batches' median and the model's predicted batch time, and at least
    # `stall_min_s`, is reported as stuck with the operator it is in (a warning on stderr, the
    # progress line, RunReport.stalls), again each time its time doubles. It is not stopped.
    stall_factor: float = 10.0
    stall_min_s: float = 60.0
    # Dead letters kept in the driver's memory when no dead-letter path is given (the count is
    # always exact; older letters are dropped from memory, never from a dead-letter path).
    dead_letters_kept: int = 1000
    # State store of every stateful operator. RocksDB: required by transformWithStateInPandas and
    # by the checkpoint manager's offline state repartitioning.
    state_store_provider: str = ROCKSDB_PROVIDER
    # State partitions when a plan has no keyed region of its own to size them (a sequential plan
    # keeps everything on one partition).
    default_state_partitions: int = 1
    # Buckets of a partitioned operator's keys in a new checkpoint: its keyed stage makes one
    # Python call per bucket a batch touches, and they bound the state partitions that split its
    # work; a checkpoint keeps its count for good (fissure/state_layout.json). None: 4 per core of
    # the session, at least 8 (fissure.model.state_buckets); one of 2, 4, 8, 16, 32 or 64. Set it
    # for a checkpoint that will move to a cluster with more cores than this one.
    state_buckets: int | None = None
    # Fold the records of an `aggregate` or a tumbling or sliding `window` whose aggregate can
    # merge into one partial per key (and window) in the stage before its exchange
    # (fissure.runtime.operators.combine); False ships every record to the keyed stage, as before.
    combine_aggregates: bool = True
    # A run holds its checkpoint's lock (fissure.spark.checkpoint.lock) and renews its lease every
    # quarter of this; a run on another machine takes the checkpoint over once the lease went this
    # long without a renewal (one on the same machine as soon as the holder's process is gone).
    checkpoint_lease_s: float = 120.0
    # Spark's web UI (the Structured Streaming tab shows fissure's observed metrics) for the
    # session fissure creates; its address is printed. Off by default: it costs start-up time
    # (benchmarks/results/spark_ui_startup.md). A session passed in keeps its own setting.
    spark_ui: bool = False
    # The address Spark's web UI listens on when it runs: loopback unless named (a machine's
    # address or 0.0.0.0 opens it to the network: it has no login). Spark binds its UI to the
    # environment variable SPARK_LOCAL_IP of its JVM, else every interface; fissure sets that
    # variable when it starts the JVM.
    spark_ui_address: str = "127.0.0.1"
    # Start the Python workers of the session fissure creates in the background as it starts
    # (fissure.spark.session.create.warm_python_workers): the first micro-batch does not wait for them.
    warm_python_workers: bool = True
    # Start the driver's JVM of the session fissure creates with a class-data-sharing archive of
    # Spark's classes, made by an earlier run and checked before use (fissure.spark.session.class_archive):
    # the session starts seconds sooner on a small machine.
    jvm_class_archive: bool = True
    # The key that signs the state of operators declaring state_codec="pickle" (HMAC-SHA256; a str is
    # taken as UTF-8). None: the environment variable FISSURE_STATE_KEY, else none, and such an
    # operator refuses to start. Keep it outside the checkpoint: whoever holds it can make the
    # workers unpickle what they wrote. Never printed.
    state_key: str | bytes | None = field(default=None, repr=False)
    # "trust-pickle": read state an earlier fissure stored as bare pickles, once, and rewrite it as
    # data (docs/pipeline-api.md, "Migrating old state"); None: such state stops the run.
    state_migration: str | None = None
    # Extra Spark settings for the session fissure creates (keys outside spark.fissure.* given to
    # `from_conf` or `fissure run --conf` go here).
    spark_conf: dict[str, str] = field(default_factory=dict)
    # The SparkSession to run on; None: fissure creates one (master, app_name, spark_conf, ...).
    spark: typing.Any = field(default=None, repr=False)
    # File for everything Spark prints (JVM log lines, its Python workers' output) when fissure
    # creates the session and no JVM runs yet in this process. None: `spark.log` in a new
    # temporary directory, named when a run fails (fissure.spark.session.jvm.spark_log_path); "-": the
    # terminal, as PySpark does.
    spark_log: str | None = None
    # Operators declared waits="io" / waits="gil-free" run on elastic threads in their Python
    # worker (docs/elastic-scheduler.md): the thread-level policy ("trust-trend" or
    # "elastic-operator") and its parameters; None: the defaults (1 s periods, 1..32 threads, no
    # CPU-usage check for waits="io").
    thread_policy: str = "trust-trend"
    thread_elasticity: ElasticityConfig | None = None
    # Also run an undeclared per-record operator on elastic threads once its profile shows it
    # waiting (wall time >= 2 x CPU time). Off by default: its function never promised to be
    # thread-safe. Needs profiling (the runner's default).
    detect_waiting_operators: bool = False
    # How operators are profiled on the live stream (docs/profiling.md); None or enabled=False:
    # not at all. The statistics go to the profile log, `profile_log` (default
    # `<checkpoint>/fissure/profile.jsonl` when the run has a checkpoint), that `fissure profile` reads.
    profiling: ProfileSettings | None = field(default_factory=ProfileSettings)
    profile_log: str | None = None
    # Re-cutting the program while it runs: "off" (the plan stays as it starts), "adaptive" (the
    # adaptive loop re-plans, keeps what helps and rolls back what does not; docs/adaptive.md) or
    # "autopipeline" (the autopipelining loop places pipeline boundaries; docs/autopipelining.md).
    # One at a time: both re-cut the same program.
    replanning: str = "off"
    # The adaptive loop's parameters (docs/adaptive.md), and where it writes its timeline (None: a
    # new temporary directory).
    adaptation: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    run_dir: str | None = None
    # The autopipelining loop's parameters (docs/autopipelining.md).
    autopipelining: GraphAutopipelineConfig = field(default_factory=GraphAutopipelineConfig)
    # --- the run's extent -------------------------------------------------------------------------
    # True: process what the sources hold now and end (file sources): a `timeout_s` that passes
    # first, with input left unread, raises RunTimedOut saying what is left. False: run until
    # `timeout_s` passes (its normal end) or forever without it.
    available_now: bool = True
    timeout_s: float | None = None
    # The run ends after this many micro-batches (a later batch is left for a run on the checkpoint).
    max_batches: int | None = None
    # A sink for dead letters (e.g. FileSink(path, format="json")); they are counted and the
    # latest `dead_letters_kept` kept in memory either way.
    dead_letters: typing.Any = None
    # Per operator name, its measured or assumed cost and selectivity (OperatorEstimate), over its
    # hints, for the planner and for sizing batches.
    estimates: Mapping[str, OperatorEstimate] | None = None
    # A plain run's pipeline boundaries instead of the plan's (operators whose input starts a new
    # process of their PE), and its state partitions instead of the plan's (the most replicas of a
    # keyed region). An adaptive run re-cuts both itself.
    boundaries: tuple[str, ...] | None = None
    state_partitions: int | None = None

    def __post_init__(self) -> None:
        if self.thread_policy not in POLICY_NAMES:
            raise ValueError(f"thread_policy must be one of {', '.join(POLICY_NAMES)}, got {self.thread_policy!r}")
        if self.batch_size not in ("auto", "all"):
            raise ValueError(f"batch_size must be 'auto' or 'all', got {self.batch_size!r}")
        if not 0 < self.batch_fixed_share < 1:
            raise ValueError(f"batch_fixed_share must be between 0 and 1, got {self.batch_fixed_share!r}")
        if self.batch_latency_bound_s is not None and self.batch_latency_bound_s <= 0:
            raise ValueError(f"batch_latency_bound_s must be positive, got {self.batch_latency_bound_s!r}")
        if self.trigger_interval_s < 0 or self.progress_interval_s <= 0:
            raise ValueError("trigger_interval_s must be >= 0 and progress_interval_s > 0")
        check_progress_mode(self.progress)
        if self.progress_lines_interval_s <= 0:
            raise ValueError(f"progress_lines_interval_s must be > 0, got {self.progress_lines_interval_s!r}")
        self.restart_policy()  # checks query_restarts and query_restart_window_s
        self.stall_policy()
        if self.state_migration not in (None, "trust-pickle"):
            raise ValueError(f"state_migration must be None or 'trust-pickle', got {self.state_migration!r}")
        if self.dead_letters_kept < 0 or self.default_state_partitions < 1:
            raise ValueError("dead_letters_kept must be >= 0 and default_state_partitions >= 1")
        if self.state_buckets is not None:
            check_bucket_count(self.state_buckets)
        if not self.checkpoint_lease_s > 0:
            raise ValueError(f"checkpoint_lease_s must be > 0, got {self.checkpoint_lease_s!r}")
        self._check_run()

    def _check_run(self) -> None:
        if self.replanning not in REPLANNING:
            raise ValueError(f"replanning must be one of {', '.join(map(repr, REPLANNING))} (the adaptive loop and "
                             f"autopipelining both re-cut the program: one at a time), got {self.replanning!r}")
        if self.profiling is not None and not isinstance(self.profiling, ProfileSettings):
            raise ValueError(f"profiling must be a ProfileSettings or None (not profiled), got {self.profiling!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be a number of seconds > 0 or None (no timeout), got {self.timeout_s!r}")
        for name in ("max_batches", "state_partitions"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a whole number >= 1 or None, got {value!r}")
        if self.boundaries is not None:
            if isinstance(self.boundaries, str) or not all(isinstance(name, str) for name in self.boundaries):
                raise ValueError(f"boundaries must be a list of operator names, got {self.boundaries!r}")
            object.__setattr__(self, "boundaries", tuple(self.boundaries))
        if self.replanning == "adaptive":
            given = [name for name in ("boundaries", "state_partitions") if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{' and '.join(given)} would be dropped: an adaptive run (replanning='adaptive') "
                                 f"cuts its plan's boundaries and sizes its state partitions itself; leave "
                                 f"{' and '.join(given)} out, or set replanning='off' or 'autopipeline'")

    def stall_policy(self) -> StallPolicy:
        return StallPolicy(factor=self.stall_factor, min_s=self.stall_min_s)

    def restart_policy(self) -> RestartPolicy:
        try:
            return RestartPolicy(self.query_restarts, self.query_restart_window_s)
        except ValueError as error:
            raise ValueError(f"query_restarts / query_restart_window_s: {error}") from None

    def state_access(self) -> StateAccess:
        """The state key (this setting, else FISSURE_STATE_KEY) and the migration setting, for the workers."""
        key = self.state_key if self.state_key is not None else os.environ.get(STATE_KEY_VARIABLE)
        return StateAccess(state_key_from(key), self.state_migration == "trust-pickle")

    # --- the settings as keys ----------------------------------------------------------------
    @classmethod
    def from_conf(cls, conf: Mapping[str, object] | Iterable[tuple[str, object]],
                  base: RunnerConfig | None = None) -> RunnerConfig:
        """`base` (default: the defaults) with the settings `conf` gives as keys (see the module
        docstring). ValueError naming the key: a spark.fissure. key that names no setting (and the
        closest that does), a value of the wrong type, or one the setting refuses."""
        base = base if base is not None else cls()
        settings, spark_conf = {}, dict(base.spark_conf)
        for key, value in (conf.items() if isinstance(conf, Mapping) else conf):
            key = str(key).strip()
            if key.startswith(CONF_PREFIX):
                settings[key[len(CONF_PREFIX):]] = value
            else:
                spark_conf[key] = str(value)
        known = _keys(cls)
        for path in settings:
            if path not in known:
                raise ValueError(f"{CONF_PREFIX}{path} is no fissure setting{_closest(path, known)}")
        config = _with_settings(base, settings, "")
        return dataclasses.replace(config, spark_conf=spark_conf) if spark_conf != base.spark_conf else config

    @classmethod
    def keys(cls) -> dict[str, str]:
        """Every spark.fissure. key, with its default as text."""
        defaults = cls()
        return {CONF_PREFIX + path: _text(_value_at(defaults, path)) for path in _keys(cls)}


def _leaf_type(hint: typing.Any) -> tuple[typing.Any, bool]:
    """(the type a field's hint allows besides None, whether it allows None)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [member for member in typing.get_args(hint) if member is not type(None)]
        optional = len(members) < len(typing.get_args(hint))
        kind = members[0] if len(members) == 1 else (str if str in members else None)  # str | bytes: text
        return kind, optional
    return hint, False


def _settable(kind: typing.Any) -> bool:
    return kind in (bool, int, float, str) or kind == tuple[str, ...] or (
        isinstance(kind, type) and issubclass(kind, enum.Enum))


def _fields(tree: type) -> dict[str, typing.Any]:
    """A settings tree's fields that keys reach, with their hints: scalars and nested trees."""
    hints = typing.get_type_hints(tree)
    found = {}
    for item in dataclasses.fields(tree):
        kind, _ = _leaf_type(hints[item.name])
        if _settable(kind) or dataclasses.is_dataclass(kind):
            found[item.name] = hints[item.name]
    return found


def _keys(tree: type, prefix: str = "") -> list[str]:
    """The dotted paths of every scalar setting of `tree` (nested trees walked)."""
    paths = []
    for name, hint in _fields(tree).items():
        kind, _ = _leaf_type(hint)
        paths += _keys(kind, f"{prefix}{name}.") if dataclasses.is_dataclass(kind) else [prefix + name]
    return paths


# Settings that were once arguments of fissure.run under another name, as keys.
_RENAMED = {"adaptive": "replanning=adaptive", "autopipeline": "replanning=autopipeline",
            "profile": "profiling.enabled", "adaptive_config": "adaptation.<field>",
            "autopipeline_config": "autopipelining.<field>"}


def _closest(path: str, known: list[str]) -> str:
    if path in _RENAMED:
        return f"; did you mean {CONF_PREFIX}{_RENAMED[path]}?"
    squashed = {key.replace("_", "").lower(): key for key in known}
    same = squashed.get(path.replace("_", "").replace("-", "").lower())  # spark.fissure.timeoutS: timeout_s
    match = [same] if same else difflib.get_close_matches(path, known, n=1, cutoff=0.5)
    return f"; did you mean {CONF_PREFIX}{match[0]}?" if match else f"; the settings: RunnerConfig.keys()"


def _with_settings(tree: typing.Any, settings: Mapping[str, object], prefix: str) -> typing.Any:
    """`tree` (a settings dataclass, or None for an optional nested tree not set yet) with the
    `settings` under `prefix` applied, each value parsed to its field's type."""
    kind = type(tree)
    changes = {}
    for name, hint in _fields(kind).items():
        leaf, optional = _leaf_type(hint)
        path = prefix + name
        if dataclasses.is_dataclass(leaf):
            nested = {key: value for key, value in settings.items() if key.startswith(path + ".")}
            if nested:
                current = getattr(tree, name)
                changes[name] = _with_settings(current if current is not None else leaf(), nested, path + ".")
        elif path in settings:
            changes[name] = _parsed(CONF_PREFIX + path, settings[path], leaf, optional)
    if not changes:
        return tree
    try:
        return dataclasses.replace(tree, **changes)
    except (ValueError, TypeError) as error:
        given = ", ".join(f"{CONF_PREFIX}{prefix}{name}" for name in changes)
        raise ValueError(f"{given}: {error}") from None


def _parsed(key: str, value: object, kind: typing.Any, optional: bool) -> object:
    """A key's value as its setting's type (text parsed; a value of that type taken as it is)."""
    if not isinstance(value, str):
        if value is None and optional or (isinstance(value, kind) and not (kind is int and isinstance(value, bool))):
            return value
        value = str(value)
    text = value.strip()
    if optional and text.lower() in ("none", "null"):
        return None
    try:
        if kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if kind == tuple[str, ...]:
            return tuple(item.strip() for item in text.split(",") if item.strip())
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            return kind(text)
    except ValueError:
        wanted = {bool: "true or false", int: "a whole number", float: "a number"}.get(
            kind, f"one of {', '.join(item.value for item in kind)}" if isinstance(kind, type) and issubclass(
                kind, enum.Enum) else str(kind))
        raise ValueError(f"{key}={value!r}: expected {wanted}{' or none' if optional else ''}") from None
    return text


def _value_at(tree: typing.Any, path: str) -> object:
    """The setting at the dotted `path` of `tree` (an optional nested tree not set: its defaults')."""
    *trees, name = path.split(".")
    for part in trees:
        nested = getattr(tree, part)
        tree = nested if nested is not None else _leaf_type(typing.get_type_hints(type(tree))[part])[0]()
    return getattr(tree, name)


def _text(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)
