"""The machinery both thread-level policies share (`PolicyBase`): epochs with their coarse scan,
refinement race and settled state, on the judgments of the measurements (noise, trends, changes
in load: fissure.control.thread_level.evidence); each policy adds its own rules on top.
"""

from __future__ import annotations

import math
from collections import deque

from fissure.control.thread_level.config import ElasticityConfig
from fissure.control.thread_level.decisions import (
    LevelRecord, PeriodMeasurement, ThreadLevelDecision, cpu_usage_acceptable, geometric_ladder,
    relative_gain, trend_threshold, usable_throughput,
)
from fissure.control.thread_level.evidence import LevelEvidence
from fissure.control.thread_level.ladder import Ladder, LevelSamples, Race, Settled, Survey


# A refinement ages like trust, but slower: it costs a period per level between two rungs.
REFINEMENT_HORIZONS = 3


# Races in a row that may each move the window on when its best level is at the window's end.
MAX_RACE_EXTENSIONS = 2


class PolicyBase(LevelEvidence):
    """The skeleton both policies share; subclasses supply the paper's rules.

    Each period: validate the measurement, let the subclass observe it (change in load, expiry),
    record it, then continue a survey (coarse scan, refinement) if one is running, else move towards
    the best level if this one is clearly below it, else apply the paper's rules. When the rules
    hold at a level for the first time in an epoch, the refinement starts. An epoch begins at the
    start and at each change in load; it forgets every record.
    """

    name = "abstract"

    def __init__(self, config: ElasticityConfig | None = None) -> None:
        self.config = config or ElasticityConfig()
        self._level = self.config.min_threads
        self._ladder = Ladder(self.config)
        self._records = {
            level: LevelSamples(self.config.smoothing_window)
            for level in range(self.config.min_threads, self.config.max_threads + 1)
        }
        self._time = 0
        self._survey: Survey | None = None
        self._race: Race | None = None
        self._settled: Settled | None = None
        self._refined: dict[int, int] = {}  # level -> logical time of its last refinement
        self._deviations: dict[int, list[float]] = {}  # per level: consecutive deviating samples
        # One estimate of the relative noise per sample taken at a level already measured.
        self._noise_samples: deque[float] = deque(maxlen=48)
        self._start_epoch()

    @property
    def level(self) -> int:
        return self._level

    def records(self) -> tuple[LevelRecord, ...]:
        """What the policy knows about each level, for tests, logs and timelines."""
        return tuple(
            LevelRecord(
                level=level,
                trusted=record.trusted,
                throughput_per_s=record.throughput,
                first_throughput_per_s=record.first_throughput,
                peak_per_s=record.peak,
                last_time=record.last_time,
                samples=len(record.recent),
            )
            for level, record in self._records.items()
        )

    def rungs(self) -> tuple[int, ...]:
        return tuple(self._ladder.rungs)

    # -- the template -------------------------------------------------------------------------
    def decide(self, measurement: PeriodMeasurement) -> ThreadLevelDecision:
        now_s = measurement.now_s
        throughput = usable_throughput(measurement)
        if throughput is None:
            return ThreadLevelDecision.hold(self._level, now_s, "no usable throughput measurement: no change")
        if measurement.level_in_force is not None and measurement.level_in_force != self._level:
            return ThreadLevelDecision.hold(
                self._level,
                now_s,
                f"level {self._level} not in force yet ({measurement.level_in_force} threads active): no change",
            )
        self._time += 1
        self._note_noise(throughput)
        prefix = self._observe(throughput)
        self._records[self._level].record(throughput, self._time)
        self._after_record()
        if self._survey is not None:
            return self._continue_survey(measurement, prefix)
        if self._race is not None:
            return self._continue_race(now_s, prefix)
        if self._settled is not None:
            return self._settled_step(measurement, prefix)
        decision = self._pull_towards_best(measurement, prefix) or self._rules(measurement, prefix)
        if decision is not None:
            return decision
        return self._start_refinement(now_s, prefix) or ThreadLevelDecision.hold(
            self._level, now_s, prefix + self._stable_reason()
        )

    def _observe(self, throughput: float) -> str:
        """Before recording: the subclass's change-in-load or peak bookkeeping; a reason prefix."""
        return ""

    def _after_record(self) -> None:
        """After recording: the subclass's bookkeeping that needs this period's sample."""

    def _rules(self, measurement: PeriodMeasurement, prefix: str) -> ThreadLevelDecision | None:
        """The paper's rules: a decision, or None when they hold the level (stable)."""
        raise NotImplementedError

    def _stable_reason(self) -> str:
        return "stable"

    def _gain_threshold(self, lower_level: int, upper_level: int) -> float:
        """The relative gain between two levels that the paper's rules call significant."""
        return trend_threshold(self.config, lower_level, upper_level, self.config.sensitivity)

    # -- shared steps -------------------------------------------------------------------------
    def _move(self, level: int, now_s: float, reason: str) -> ThreadLevelDecision:
        previous, self._level = self._level, level
        if level == previous:
            return ThreadLevelDecision.hold(level, now_s, reason)
        return ThreadLevelDecision.move(previous, level, now_s, reason)

    def _expire_trust(self) -> None:
        """Improvement 6: what a level not visited within the horizon recorded is forgotten."""
        horizon = self.config.trust_horizon_periods
        if horizon is None or self._settled is not None:
            return  # settled: the probes (improvement 10) refresh the neighbours instead
        for level, record in self._records.items():
            if record.trusted and level != self._level and self._time - record.last_time > horizon:
                record.forget()

    def _start_epoch(self, after_load_change: bool = False) -> None:
        """Forget every record, reset the ladder, and schedule the coarse scan (improvement 7):
        the whole range at the start, the levels around the one in force after a change in load
        (improvement 11)."""
        for record in self._records.values():
            record.forget()
        self._refined.clear()
        self._ladder.reset(self._level)
        self._survey = None
        self._race = None
        self._settled = None
        ratio = self.config.coarse_scan_ratio
        if ratio is not None:
            scan = geometric_ladder(self.config.min_threads, self.config.max_threads, ratio)
            span = self.config.load_change_scan_span
            local = after_load_change and span is not None
            purpose = f"scan around level {self._level}" if local else "coarse scan"
            if local:
                scan = tuple(level for level in scan if self._level / span <= level <= self._level * span)
            # Start with the level in force (it is measured now anyway), then climb.
            todo = [level for level in scan if level != self._level]
            self._survey = Survey(purpose, deque(todo), tuple(sorted({self._level, *scan})), local=local)

    def _start_refinement(self, now_s: float, prefix: str) -> ThreadLevelDecision | None:
        """Improvement 8: the rules hold at a rung; race the levels between its neighbours."""
        if not self.config.refine:
            return self._settle_without_refinement(now_s, prefix)
        if self._refined_recently(self._level):
            return None
        self._refined[self._level] = self._time
        candidates = self._ladder.levels_between_neighbours(self._level)
        if self.config.settle:
            candidates = self._race_window(self._level)
        if not candidates:
            return self._settle_without_refinement(now_s, prefix)
        self._race = self._new_race(self._level, candidates)
        return self._continue_race(now_s, prefix)

    def _new_race(self, home: int, candidates: list[int], extensions: int = 0) -> Race:
        levels = [home, *candidates]
        rungs = (self._ladder.below(home), self._ladder.above(home))
        edge = tuple(rung for rung in rungs if rung is not None)
        return Race(home, levels, dict.fromkeys(levels, 0), edge=edge, extensions=extensions)

    def _settle_without_refinement(self, now_s: float, prefix: str) -> ThreadLevelDecision | None:
        """With nothing to refine, the level the rules hold at is the settled one."""
        if not self.config.settle:
            return None
        self._enter_settled(self._level)
        reason = prefix + f"settle on level {self._level}: the rules hold here"
        return ThreadLevelDecision.hold(self._level, now_s, reason)

    def _continue_race(self, now_s: float, prefix: str) -> ThreadLevelDecision:
        """One period of the refinement's race. Without improvement 10 (the papers' noise):
        every candidate measured once, nearest to home first, then the best. With it, rounds of
        successive halving: every level left gets `target` samples; then the better half (by
        `_smoothed_value`, at least two) stays and the target doubles, up to `refine_samples`;
        any time, a level the leader beats by `settle_tie_margin` plus `settle_noise_z` standard
        errors drops out (after two samples: the leader is the luckiest of several). Then the
        best of those left."""
        race = self._race
        assert race is not None
        if self._level in race.samples:
            race.samples[self._level] += 1
        if self.config.settle:
            self._race_eliminate(race)
        while True:
            pending = [level for level in race.candidates if race.samples[level] < race.target]
            if pending:
                level = min(
                    pending, key=lambda candidate: (race.samples[candidate], abs(candidate - self._level), candidate)
                )
                again = " again" if race.samples[level] else ""
                left = len(race.candidates)
                return self._move(level, now_s, prefix + f"refine: measure level {level}{again} ({left} left)")
            if len(race.candidates) == 1 or race.target >= self.config.refine_samples or not self.config.settle:
                break
            ranked = sorted(race.candidates, key=self._smoothed_value, reverse=True)
            race.candidates = ranked[: max(2, math.ceil(len(ranked) / 2))]
            race.target = min(2 * race.target, self.config.refine_samples)
        self._race = None
        # Under noise the smallest level within the tie margin is mostly the edge of a plateau,
        # so with the settled state the level with the highest mean wins.
        if self.config.settle:
            chosen = max(race.candidates, key=self._smoothed_value)
        else:
            chosen = self._best_of(tuple(race.candidates))
        self._refined[chosen] = self._time
        left = ", ".join(str(level) for level in sorted(race.candidates))
        if (
            self.config.settle
            and chosen in race.edge
            and race.extensions < MAX_RACE_EXTENSIONS
            and self._confidently_better(race.home, chosen, 0.0, noise_z=1.0)
        ):
            # The best is a rung at the window's end, clearly above the middle: a slope, so the
            # true best may lie beyond it. (On a plateau an end wins by chance only: no new race.)
            self._ladder.reset(chosen)
            self._race = self._new_race(chosen, self._race_window(chosen), race.extensions + 1)
            moved_on = f"refine: level {chosen} won at the window's end; race around it; "
            return self._continue_race(now_s, prefix + moved_on)
        if self.config.settle:
            self._enter_settled(chosen)
            reason = f"refine: settle on level {chosen}, the best between the rungs around {race.home} (left: {left})"
        else:
            reason = f"refine: go to level {chosen}, the best between the rungs around {race.home}"
        return self._move(chosen, now_s, prefix + reason)

    def _race_window(self, level: int) -> list[int]:
        """The levels between the rungs around `level`, and the rungs: under noise the rules may
        hold one rung off the best."""
        rungs = [self._ladder.below(level), self._ladder.above(level)]
        return self._ladder.levels_between_neighbours(level) + [rung for rung in rungs if rung is not None]

    def _race_eliminate(self, race: Race) -> None:
        measured = [level for level in race.candidates if race.samples[level]]
        if not measured:
            return
        leader = max(measured, key=self._value)
        race.candidates = [
            level
            for level in race.candidates
            if level == leader
            or race.samples[level] < 2
            or not self._confidently_better(level, leader, self.config.settle_tie_margin)
        ]

    # -- improvement 10: the settled state ------------------------------------------------------
    def _enter_settled(self, level: int) -> None:
        self._ladder.reset(level)
        interval = self.config.probe_interval_periods
        self._settled = Settled(level=level, interval=interval, next_probe_time=self._time + interval)

    def _settled_step(self, measurement: PeriodMeasurement, prefix: str) -> ThreadLevelDecision:
        """Hold the settled level, sampling it every period so its mean sharpens. Every
        `interval` periods probe a neighbouring rung (`_probe_target`); move there only if its
        mean beats the settled level's by the paper's threshold plus `settle_noise_z` standard
        errors; stay up to `probe_samples` periods at a neighbour that looks better but not yet
        significantly, or whose sample departs from its record (a change in load is confirmed
        there, by `_observe`); back off (interval doubles, up to `max_probe_interval_periods`)
        after each probe that finds no gain."""
        settled, now_s = self._settled, measurement.now_s
        assert settled is not None
        home = settled.level
        if settled.probe is None:
            if self._time < settled.next_probe_time:
                left = settled.next_probe_time - self._time
                held = len(self._records[home].recent)
                reason = f"settled at level {home} ({held} samples), probe in {left} periods"
                return ThreadLevelDecision.hold(home, now_s, prefix + reason)
            target = self._probe_target(home, settled.last_probed, measurement)
            if target is None:
                settled.next_probe_time = self._time + settled.interval
                return ThreadLevelDecision.hold(home, now_s, prefix + f"settled at level {home}: no neighbour to probe")
            settled.probe, settled.probe_periods = target, 0
            return self._move(target, now_s, prefix + f"settled at level {home}: probe level {target}")
        probe = settled.probe
        settled.probe_periods += 1
        lower, upper = sorted((home, probe))
        threshold = self._gain_threshold(lower, upper)
        gain = relative_gain(self._value(home), self._value(probe))
        samples = f"{len(self._records[probe].recent)} vs {len(self._records[home].recent)} samples"
        if self._confidently_better(home, probe, threshold):
            self._enter_settled(probe)
            reason = f"settled: level {probe} beats level {home} by {gain:.1%} ({samples}); settle there"
            return ThreadLevelDecision.hold(probe, now_s, prefix + reason)
        if self._deviations.get(probe) and settled.probe_periods <= self.config.probe_samples:
            # This sample departs from what the level measured before: stay to confirm a change in load.
            return ThreadLevelDecision.hold(
                probe, now_s, prefix + f"settled: level {probe} departs from its record; measure again"
            )
        if gain > 0 and settled.probe_periods < self.config.probe_samples:
            reason = f"settled: level {probe} {gain:+.1%} against level {home}, not significant yet; measure again"
            return ThreadLevelDecision.hold(probe, now_s, prefix + reason)
        if gain <= 0:
            settled.interval = min(2 * settled.interval, self.config.max_probe_interval_periods)
        settled.probe, settled.last_probed = None, probe
        settled.next_probe_time = self._time + 1 + settled.interval
        verdict = "no gain" if gain <= 0 else "gain not significant"
        return self._move(
            home,
            now_s,
            prefix + f"settled: level {probe} {gain:+.1%} against level {home} ({samples}), {verdict}; "
            f"back, next probe in {settled.interval} periods",
        )

    def _probe_target(self, home: int, last_probed: int | None, measurement: PeriodMeasurement) -> int | None:
        """The neighbouring rung not probed last time (a change that does not show at the
        settled level may show on either side); the first time, the one with the higher upper
        confidence bound (unknown: infinite). An increase only while the CPU usage is acceptable."""
        neighbours = [self._ladder.below(home)]
        if cpu_usage_acceptable(self.config, measurement):
            neighbours.append(self._ladder.above(home))
        candidates = [level for level in neighbours if level is not None]
        if not candidates:
            return None
        if last_probed is not None and len(candidates) > 1:
            return next(level for level in candidates if level != last_probed)

        def upper_bound(level: int) -> float:
            record = self._records[level]
            if not record.trusted:
                return math.inf
            spread = self.config.settle_noise_z * self._noise() / math.sqrt(len(record.recent))
            return relative_gain(self._value(home), record.throughput * (1 + spread))

        # Ties (both unknown) go to the one visited longer ago.
        return max(candidates, key=lambda level: (upper_bound(level), -self._records[level].last_time))

    def _refined_recently(self, level: int) -> bool:
        """Refined in this epoch, and (improvement 6) not longer ago than three trust horizons."""
        if level not in self._refined:
            return False
        horizon = self.config.trust_horizon_periods
        return horizon is None or self._time - self._refined[level] <= REFINEMENT_HORIZONS * horizon

    def _continue_survey(self, measurement: PeriodMeasurement, prefix: str) -> ThreadLevelDecision:
        """The scan's next level, or the rules from the best scanned. The scan climbs only while
        the CPU usage is acceptable (the Streams paper's check before any increase): levels above a
        level that already keeps the machine busy are dropped from it."""
        survey = self._survey
        assert survey is not None
        now_s = measurement.now_s
        if survey.todo and not cpu_usage_acceptable(self.config, measurement):
            dropped = [level for level in survey.todo if level > self._level]
            if dropped:
                survey.todo = deque(level for level in survey.todo if level <= self._level)
                survey.candidates = tuple(level for level in survey.candidates if level not in dropped)
                prefix += f"CPU usage {measurement.cpu_usage:.0%}: scan no higher than level {self._level}; "
        if not survey.todo and survey.local:
            prefix += self._extend_local_scan(survey, measurement)
        if survey.todo:
            level = survey.todo.popleft()
            return self._move(level, now_s, prefix + f"{survey.purpose}: measure level {level}")
        self._survey = None
        chosen = self._best_of(survey.candidates)
        self._ladder.reset(chosen)
        reason = f"{survey.purpose}: start the rules from level {chosen}, the best scanned"
        return self._move(chosen, now_s, prefix + reason)

    def _extend_local_scan(self, survey: Survey, measurement: PeriodMeasurement) -> str:
        """Improvement 11: a local scan goes on along the coarse scan's levels, one at a time,
        beyond its lowest (highest) level while that level is the best or not clearly below the
        best (2 standard errors): the best moved farther than the span, or the scan sits on a
        plateau or a floor with no slope for the rules to follow, which may hide a peak beyond.
        Upwards only while the CPU usage is acceptable. Returns a reason prefix ("" when done)."""
        measured = [level for level in survey.candidates if self._records[level].trusted]
        if not measured:
            survey.local = False
            return ""
        ladder = geometric_ladder(self.config.min_threads, self.config.max_threads, self.config.coarse_scan_ratio)
        best = max(measured, key=self._value)

        def open_edge(edge: int) -> bool:
            return edge == best or not self._confidently_better(edge, best, 0.0, noise_z=2.0)

        lowest, highest = min(measured), max(measured)
        beyond = []
        if open_edge(lowest):
            beyond.append(next((level for level in reversed(ladder) if level < lowest), None))
        if open_edge(highest) and cpu_usage_acceptable(self.config, measurement):
            beyond.append(next((level for level in ladder if level > highest), None))
        beyond = [level for level in beyond if level is not None and level not in survey.candidates]
        if not beyond:
            survey.local = False
            return ""
        survey.todo.extend(beyond)
        survey.candidates = tuple(sorted({*survey.candidates, *beyond}))
        edges = " and ".join(str(level) for level in beyond)
        return f"best scanned level {best}, the scan's edge not clearly below it: measure {edges} too; "

    def _best_trusted(self) -> int:
        """The trusted level with the highest smoothed throughput."""
        return max((level for level, record in self._records.items() if record.trusted), key=self._value)

    def _within_guard(self, level: int) -> bool:
        """Improvement 9: the epoch's best level does not clearly beat `level` (margin and noise)."""
        margin = self.config.decrease_guard_margin
        record = self._records[level]
        if margin is None or not record.trusted:
            return True
        best_level = self._best_trusted()
        return not self._significantly_greater(
            record.throughput, self._value(best_level), margin, len(record.recent), len(self._records[best_level].recent)
        )

    def _pull_towards_best(self, measurement: PeriodMeasurement, prefix: str) -> ThreadLevelDecision | None:
        """Improvement 9: this level is clearly worse than the epoch's best level, so move towards
        it: to the best level itself, or to the next rung on the way if that comes first."""
        if self.config.decrease_guard_margin is None or self._within_guard(self._level):
            return None
        best_level = self._best_trusted()
        if best_level > self._level:
            if not cpu_usage_acceptable(self.config, measurement):
                return None
            step = self._ladder.above(self._level)
            target = best_level if step is None else min(best_level, step)
        else:
            step = self._ladder.below(self._level)
            target = best_level if step is None else max(best_level, step)
        return self._move(
            target,
            measurement.now_s,
            prefix + f"towards the best: level {self._level} measured clearly below level {best_level}",
        )

    def _best_of(self, levels: tuple[int, ...]) -> int:
        """The smallest measured level within settle_tie_margin of the best measured one."""
        measured = {level: self._value(level) for level in levels if self._records[level].trusted}
        best = max(measured.values())
        return min(level for level, value in measured.items() if value >= best * (1 - self.config.settle_tie_margin))
