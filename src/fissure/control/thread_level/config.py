"""The thread-level policies' parameters (`ElasticityConfig`) and their two presets: "improved" (the
default: every improvement of the package docstring on) and "as-written" (the papers' rules).
"""

from __future__ import annotations

from dataclasses import dataclass, replace




POLICY_NAMES = ("trust-trend", "elastic-operator")
PRESETS = ("improved", "as-written")


@dataclass(frozen=True)
class ElasticityConfig:
    """Every parameter of the thread-level policies, with its default and the papers' value.

    Attributes:
        min_threads: lowest level. The Streams paper keeps one more scheduler thread than the most
            input ports of one operator, so that the scheduler cannot deadlock; fissure's runner
            feeds the scheduler from the caller's thread, which drains full queues itself, so 1 is safe.
        max_threads: highest level (the Streams paper caps it at the logical processors).
        period_s: seconds between two decisions (Streams: 10 s, 2009 paper: 1 s): long enough for a
            new level to show in the throughput, short enough to follow the workload.
        sensitivity: SENS, the relative difference that is a trend or a change in load (Streams: 0.05).
        cpu_usage_limit: trust-trend makes no increase while the machine's CPU usage (0..1) is above
            this (Streams: 0.8, from /proc/stat). None disables the check.
        tolerance: TOLERANCE of the elastic operator's less() (2009 paper: value not given).
        decay_rate: DECAY_RATE, the share a peak loses in each period that does not reach it (2009
            paper: value not given).
        ladder_ratio: improvement 1, geometric step between rungs; 1.0 is the papers' +-1.
        sensitivity_per_doubling: improvement 2; False is the papers' threshold per step.
        smoothing_window: improvement 3, samples averaged per level (the most recent ones); 1 is the
            papers' last sample. Large, so that a level held for long gets a sharp estimate; a
            change in load starts every level afresh, so old samples never mix with new ones.
        trend_noise_z: improvement 4, standard errors of noise a trend must exceed; 0 is the papers'.
        assumed_noise: improvement 4, relative noise of one sample until repeated samples tell
            (weighs as two samples; cautious, since a low guess makes noise look like trends).
        load_change_confirmations: improvement 5, deviating periods in a row; 1 is the Streams paper's.
        load_change_noise_z: improvement 5, standard errors of noise a deviation must also exceed.
        elastic_operator_load_change: improvement 5 for the elastic operator (the 2009 paper has no
            change-in-load test: it decays peaks and invalidates those above a big gain).
        trust_horizon_periods: improvement 6, periods after which what a level not visited recorded
            is forgotten; None is the papers' (trust lasts until a change in load). Not applied in
            the settled state (improvement 10), whose probes refresh the neighbours.
        coarse_scan_ratio: improvement 7, geometric step of the scanned levels; None: no scan.
        load_change_scan_span: improvement 11, after a change in load scan only the coarse scan's
            levels from (level in force / span) to (level in force x span); None: all of them.
        refine: improvement 8, measure the levels between the neighbouring rungs once the rules hold.
        settle_tie_margin: improvement 8, levels within this share of the best count as equal, and
            the smallest wins (fewer threads for the same throughput).
        refine_samples: improvement 8, at most this many samples per level in the refinement's race
            (levels clearly below the leader drop out early); 1 measures each level once.
        decrease_guard_margin: improvement 9, a level counts as clearly below the epoch's best when
            the best beats it by more than this share (and the noise); such a level is not the
            target of a decrease for want of a trend (trust-trend's rule 5, the elastic operator
            staying low after peaking), and the policy moves from it towards the best. None: off.
        load_change_window: improvement 5, a change in load is also the mean of a level's last this
            many samples departing from the mean of its earlier samples (at least as many) by more
            than SENS and `load_change_mean_z` standard errors: under noise of 10 % and more, a
            drop of 30 % hides in single samples but not in a mean of four. None: off.
        load_change_mean_z: improvement 5, standard errors for that test (high: it runs every period).
        settle: improvement 10, after the refinement hold the chosen level (settled): keep sampling
            it, probe one neighbouring rung now and then, move only on a significant gain.
        settle_noise_z: improvement 10, standard errors a settled level's neighbour must beat it by
            (on top of the trend threshold) to be moved to; also the refinement's elimination test.
        probe_interval_periods: improvement 10, periods at the settled level before the first probe;
            doubled after each probe that finds nothing better, up to max_probe_interval_periods.
        probe_samples: improvement 10, periods in a row a probe may stay at a neighbour that measures
            better but not yet significantly so.
    """

    min_threads: int = 1
    max_threads: int = 32
    period_s: float = 1.0
    sensitivity: float = 0.05
    cpu_usage_limit: float | None = 0.8
    tolerance: float = 0.05
    decay_rate: float = 0.01
    ladder_ratio: float = 1.25
    sensitivity_per_doubling: bool = True
    smoothing_window: int = 32
    trend_noise_z: float = 0.5
    assumed_noise: float = 0.1
    load_change_confirmations: int = 2
    load_change_noise_z: float = 2.5
    elastic_operator_load_change: bool = True
    trust_horizon_periods: int | None = 40
    coarse_scan_ratio: float | None = 1.6
    load_change_scan_span: float | None = 2.0
    refine: bool = True
    settle_tie_margin: float = 0.01
    refine_samples: int = 6
    decrease_guard_margin: float | None = 0.01
    load_change_window: int | None = 4
    load_change_mean_z: float = 3.5
    settle: bool = True
    settle_noise_z: float = 2.0
    probe_interval_periods: int = 8
    max_probe_interval_periods: int = 32
    probe_samples: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.min_threads <= self.max_threads:
            raise ValueError(
                f"thread levels need 1 <= min_threads <= max_threads, got {self.min_threads}..{self.max_threads}"
            )
        if not self.period_s > 0:
            raise ValueError(f"period_s must be > 0, got {self.period_s}")
        for name in ("sensitivity", "tolerance", "decay_rate", "settle_tie_margin", "assumed_noise"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if self.cpu_usage_limit is not None and not 0 < self.cpu_usage_limit <= 1:
            raise ValueError(f"cpu_usage_limit must be in (0, 1] or None, got {self.cpu_usage_limit}")
        if not self.ladder_ratio >= 1:
            raise ValueError(f"ladder_ratio must be >= 1 (1 means neighbours +-1), got {self.ladder_ratio}")
        if self.coarse_scan_ratio is not None and not self.coarse_scan_ratio > 1:
            raise ValueError(f"coarse_scan_ratio must be > 1 or None, got {self.coarse_scan_ratio}")
        if self.load_change_scan_span is not None and not self.load_change_scan_span > 1:
            raise ValueError(f"load_change_scan_span must be > 1 or None, got {self.load_change_scan_span}")
        if self.smoothing_window < 1 or self.load_change_confirmations < 1 or self.refine_samples < 1:
            raise ValueError("smoothing_window, load_change_confirmations and refine_samples must be >= 1")
        if self.trust_horizon_periods is not None and self.trust_horizon_periods < 1:
            raise ValueError(f"trust_horizon_periods must be >= 1 or None, got {self.trust_horizon_periods}")
        if self.trend_noise_z < 0 or self.load_change_noise_z < 0:
            raise ValueError("trend_noise_z and load_change_noise_z must be >= 0")
        if self.decrease_guard_margin is not None and not 0 <= self.decrease_guard_margin < 1:
            raise ValueError(f"decrease_guard_margin must be in [0, 1) or None, got {self.decrease_guard_margin}")
        if self.settle_noise_z < 0:
            raise ValueError(f"settle_noise_z must be >= 0, got {self.settle_noise_z}")
        if not 1 <= self.probe_interval_periods <= self.max_probe_interval_periods:
            raise ValueError(
                "probe_interval_periods must be >= 1 and <= max_probe_interval_periods, got "
                f"{self.probe_interval_periods} and {self.max_probe_interval_periods}"
            )
        if self.load_change_window is not None and self.load_change_window < 2:
            raise ValueError(f"load_change_window must be >= 2 or None, got {self.load_change_window}")
        if self.probe_samples < 1:
            raise ValueError(f"probe_samples must be >= 1, got {self.probe_samples}")

    @classmethod
    def preset(cls, name: str, **overrides) -> ElasticityConfig:
        """A named preset with `overrides` on top: "improved" (the defaults, every improvement on)
        or "as-written" (the papers' rules, every improvement off). The improvements' switches are
        only ever set all together; the numeric parameters (levels, period, SENS, CPU limit) are
        the ones to tune."""
        if name == "improved":
            return cls(**overrides)
        if name == "as-written":
            return cls.as_written(**overrides)
        raise ValueError(f"unknown thread-level preset {name!r}; choose one of {', '.join(PRESETS)}")

    @classmethod
    def as_written(cls, **overrides) -> ElasticityConfig:
        """The papers' algorithms without any improvement (for comparison)."""
        paper = dict(
            ladder_ratio=1.0,
            sensitivity_per_doubling=False,
            smoothing_window=1,
            trend_noise_z=0.0,
            load_change_confirmations=1,
            load_change_noise_z=0.0,
            elastic_operator_load_change=False,
            trust_horizon_periods=None,
            coarse_scan_ratio=None,
            load_change_scan_span=None,
            refine=False,
            refine_samples=1,
            decrease_guard_margin=None,
            settle=False,
            load_change_window=None,
        )
        return cls(**{**paper, **overrides})

    def with_levels(self, min_threads: int, max_threads: int) -> ElasticityConfig:
        return replace(self, min_threads=min_threads, max_threads=max_threads)
