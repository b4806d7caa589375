"""Every setting of a run, in one typed tree with its defaults and what each is for.

    RunnerConfig(master="local[2]",
                 profiling=ProfileSettings(window_batches=10),
                 thread_policy="elastic-operator",
                 adaptation=AdaptiveConfig(min_gain=0.1),
                 autopipelining=GraphAutopipelineConfig(profile_batches=5))

`fissure.run(..., config=RunnerConfig(...))` reads all of it; its keyword arguments `profile=`,
`adaptive_config=` and `autopipeline_config=`, when given, take precedence over the tree's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fissure.control.adaptive.config import AdaptiveConfig
from fissure.lifecycle.failures import RestartPolicy
from fissure.lifecycle.progress import check_progress_mode
from fissure.lifecycle.watchdog import StallPolicy
from fissure.control.thread_level.config import ElasticityConfig, POLICY_NAMES
from fissure.profile.settings import ProfileSettings
from fissure.spark.adaptive.autopipelining import GraphAutopipelineConfig
from fissure.runtime.state.codec import STATE_KEY_VARIABLE, StateAccess, state_key_from

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@dataclass(frozen=True)
class RunnerConfig:
    """How fissure runs a pipeline on Spark. Every field has a default that works out of the box."""

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
    # Time between micro-batch starts; 0 starts the next batch as soon as the last one ends.
    trigger_interval_s: float = 0.0
    # Micro-batch size of a file source given none (FileSource's max_*_per_trigger; fissure run's
    # --kb-per-batch / --files-per-batch). "auto": from the Spark model of the plan in force, the
    # smallest batch whose fixed cost is at most `batch_fixed_share` of it, capped so a batch
    # takes at most `batch_latency_bound_s` (fissure.lifecycle.batch_size); "all": every new file in
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
    # Extra Spark settings for the session fissure creates.
    spark_conf: dict[str, str] = field(default_factory=dict)
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
    # How operators are profiled on the live stream (docs/profiling.md); enabled=False: not at all.
    profiling: ProfileSettings = field(default_factory=ProfileSettings)
    # The adaptive loop's parameters, for a run that adapts (docs/adaptive.md).
    adaptation: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    # The autopipelining loop's parameters, for a run that autopipelines (docs/autopipelining.md).
    autopipelining: GraphAutopipelineConfig = field(default_factory=GraphAutopipelineConfig)

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
        if not self.checkpoint_lease_s > 0:
            raise ValueError(f"checkpoint_lease_s must be > 0, got {self.checkpoint_lease_s!r}")

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
