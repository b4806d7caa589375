"""Where to insert threaded ports in a stream graph that is not a chain (autopipelining).

Tang and Gedik, "Autopipelining for Data Stream Processing", TPDS 2013, Sections 3 and 4. The
input is a profile: per thread t its utilization mu(t) and, per operator input port o on its
execution path, mu(o, t), the share of a core t spends downstream of o. The output is the set of
ports that get a new thread, chosen so that:

- every bottleneck thread (mu(t) >= beta) gets exactly one new thread on its execution path,
  dependent bottleneck threads (those sharing a port) all or none of them;
- no blacklisted port is used and every predicted load stays below 100 %;
- the aggregate utility, the largest predicted load of any thread touched, is minimal.

Inserting at port o cuts every thread of T(o) = {t | mu(o, t) > 0} at o: an old thread keeps
mu(t) - mu(o, t), the new thread takes sum_t mu(o, t). The utility of the insertion is the
largest of these loads, the aggregate utility of a set of insertions the largest of theirs.

The search is the paper's tree of selections and removals of shared ports, with its pruning at
100 %, its sorting by degree of sharing, its filtering of dependent threads and its candidate
formation. It is exact: the answer's aggregate utility is the minimum over every valid choice.
docs/autopipelining.md states the readings taken where the paper is ambiguous.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

DEFAULT_BETA = 0.8  # the paper's running example
# An insertion predicted to load a thread to 100 % or more relieves nothing (paper's pruning).
UTILIZATION_LIMIT = 1.0
# Utilizations are sampled fractions; sums like 0.5 + 0.5 must compare as 1.0.
UTILIZATION_TOLERANCE = 1e-9


def natural_sort_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Orders "o2" before "o10", so that answers read in the order people number operators."""
    return tuple(
        (0, int(chunk)) if chunk.isdigit() else (1, chunk) for chunk in re.findall(r"\d+|\D+", name)
    )


def _check_fraction(value: float, what: str) -> None:
    # NaN passes: a missing measurement is handled by the planner (no change), not refused here.
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{what}: utilization must be a number, got {value!r}")
    if not math.isnan(value) and not 0.0 <= value <= 1.0:
        raise ValueError(
            f"{what}: utilization {value} is outside [0, 1]; utilizations are fractions of one"
            " core (0.9 means 90 %)"
        )


@dataclass(frozen=True)
class ThreadProfile:
    """One thread: its utilization mu(t) and mu(o, t) for each operator input port it runs."""

    name: str
    utilization: float
    port_utilization: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a thread needs a non-empty name")
        _check_fraction(self.utilization, f"thread {self.name!r}")
        for port, port_utilization in self.port_utilization.items():
            what = f"thread {self.name!r}, port {port!r}"
            if not port:
                raise ValueError(f"thread {self.name!r}: a port needs a non-empty operator name")
            _check_fraction(port_utilization, what)
            if port_utilization > self.utilization + UTILIZATION_TOLERANCE:
                raise ValueError(
                    f"{what}: utilization {port_utilization} exceeds the thread's own"
                    f" {self.utilization}; the time spent downstream of a port is part of the"
                    " thread's time"
                )

    @property
    def execution_path(self) -> frozenset[str]:
        """The ports this thread runs: those with mu(o, t) > 0, as the paper's T(o) counts them."""
        return frozenset(port for port, value in self.port_utilization.items() if value > 0)


@dataclass(frozen=True)
class AutopipelineProfile:
    """The optimizer's input: every thread's profile, beta and the blacklisted ports."""

    threads: tuple[ThreadProfile, ...]
    beta: float = DEFAULT_BETA
    blacklisted_ports: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.threads:
            raise ValueError("the profile has no threads; profile at least one running thread")
        names = [thread.name for thread in self.threads]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"thread names must be unique, repeated: {', '.join(duplicated)}")
        if not isinstance(self.beta, (int, float)) or not 0.0 <= self.beta <= 1.0:
            raise ValueError(
                f"beta must be a number in [0, 1] (threads at or above it are bottlenecks), got"
                f" {self.beta!r}"
            )

    def thread(self, name: str) -> ThreadProfile:
        for thread in self.threads:
            if thread.name == name:
                return thread
        raise KeyError(f"no thread named {name!r} in the profile")

    def threads_through(self, port: str) -> tuple[ThreadProfile, ...]:
        """T(o): the threads that run port o, in natural name order."""
        running = [thread for thread in self.threads if port in thread.execution_path]
        return tuple(sorted(running, key=lambda thread: natural_sort_key(thread.name)))


@dataclass(frozen=True)
class PredictedLoad:
    """mu'(t): the share of a core a thread is predicted to carry after an insertion."""

    thread: str
    load: float


@dataclass(frozen=True)
class Insertion:
    """A new thread at an operator's input port and the work distribution it predicts."""

    operator: str
    threads: tuple[str, ...]  # T(o): every thread the new one relieves
    remaining_loads: tuple[PredictedLoad, ...]  # mu(t) - mu(o, t) for t in T(o)
    new_thread_load: float  # sum of mu(o, t) over T(o)

    @property
    def utility(self) -> float:
        """U(o, t'): the largest predicted load among the threads the insertion touches."""
        return max([self.new_thread_load, *(remaining.load for remaining in self.remaining_loads)])


@dataclass(frozen=True)
class UnservedGroup:
    """Dependent bottleneck threads that get no new thread this round, and why."""

    threads: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class AutopipelinePlan:
    """The optimizer's answer: insertions (possibly none), their aggregate utility and why."""

    insertions: tuple[Insertion, ...]
    utility: float | None  # U(C), None when nothing is inserted
    bottleneck_threads: tuple[str, ...]
    unserved_groups: tuple[UnservedGroup, ...]
    reason: str

    @classmethod
    def no_insertion(
        cls,
        reason: str,
        bottleneck_threads: tuple[str, ...] = (),
        unserved_groups: tuple[UnservedGroup, ...] = (),
    ) -> AutopipelinePlan:
        return cls((), None, bottleneck_threads, unserved_groups, reason)


def predict_insertion(profile: AutopipelineProfile, operator: str) -> Insertion:
    """The paper's mu' for a threaded port at `operator` (Section 3.1.1)."""
    running = profile.threads_through(operator)
    if not running:
        raise ValueError(f"no thread runs port {operator!r}; pick a port listed in the profile")
    return Insertion(
        operator=operator,
        threads=tuple(thread.name for thread in running),
        remaining_loads=tuple(
            PredictedLoad(thread.name, thread.utilization - thread.port_utilization[operator])
            for thread in running
        ),
        new_thread_load=math.fsum(thread.port_utilization[operator] for thread in running),
    )


def bottleneck_threads(profile: AutopipelineProfile) -> tuple[str, ...]:
    """Threads at or above beta; the paper eliminates those below it."""
    names = [thread.name for thread in profile.threads if thread.utilization >= profile.beta]
    return tuple(sorted(names, key=natural_sort_key))


def dependent_groups(
    profile: AutopipelineProfile, threads: Iterable[str]
) -> tuple[tuple[str, ...], ...]:
    """Connected groups of `threads`, two threads being dependent when their paths share a port.

    Blacklisted ports count: blacklisting a port does not uncouple the threads that meet there.
    """
    remaining = sorted(threads, key=natural_sort_key)
    groups = []
    while remaining:
        group = [remaining.pop(0)]
        reached_ports = set(profile.thread(group[0]).execution_path)
        grew = True
        while grew:
            joining = [
                name for name in remaining if reached_ports & profile.thread(name).execution_path
            ]
            grew = bool(joining)
            for name in joining:
                remaining.remove(name)
                group.append(name)
                reached_ports |= profile.thread(name).execution_path
        groups.append(tuple(sorted(group, key=natural_sort_key)))
    return tuple(groups)


def _missing_measurements(profile: AutopipelineProfile) -> list[str]:
    missing = [f"thread {t.name}" for t in profile.threads if math.isnan(t.utilization)]
    missing += [
        f"thread {t.name} port {port}"
        for t in profile.threads
        for port, value in t.port_utilization.items()
        if math.isnan(value)
    ]
    return missing


def _is_feasible(utility: float) -> bool:
    return utility < UTILIZATION_LIMIT - UTILIZATION_TOLERANCE


def solution_matrix(profile: AutopipelineProfile) -> dict[str, frozenset[str]]:
    """Section 4.1's matrix: a row per bottleneck thread, its ports that are not blacklisted."""
    return {
        thread: profile.thread(thread).execution_path - profile.blacklisted_ports
        for thread in bottleneck_threads(profile)
    }


def select_port(matrix: Mapping[str, frozenset[str]], port: str) -> dict[str, frozenset[str]]:
    """The paper's selection of a shared port: it becomes the only choice of the rows holding it.

    The ports that shared a row with it leave every row: choosing one of them as well would put
    a second new thread on that row's path.
    """
    companions = frozenset().union(*(options for options in matrix.values() if port in options))
    return {
        thread: frozenset({port}) if port in options else options - companions
        for thread, options in matrix.items()
    }


def remove_port(matrix: Mapping[str, frozenset[str]], port: str) -> dict[str, frozenset[str]]:
    """The paper's removal of a shared port: it leaves every row."""
    return {thread: options - {port} for thread, options in matrix.items()}


@dataclass(frozen=True)
class _GroupChoice:
    ports: frozenset[str]
    utility: float


class _GroupSearch:
    """The tree search of Section 4.1 over one dependent group's matrix (rows: its threads)."""

    def __init__(self, rows: Mapping[str, frozenset[str]], port_utility: Mapping[str, float]):
        self.port_utility = port_utility
        self.best: _GroupChoice | None = None
        self._explore(dict(rows), frozenset())

    def _by_utility(self, port: str) -> tuple[float, tuple]:
        return (self.port_utility[port], natural_sort_key(port))

    def _explore(self, rows: dict[str, frozenset[str]], selected: frozenset[str]) -> None:
        for options in rows.values():
            # An empty row can only end in a leaf that the dependent-thread filter eliminates.
            if not options:
                return
            # Pruning: this row cannot be served below 100 % (the paper), or below the best
            # candidate found so far (ours; it keeps the search exact and only makes it faster).
            lower_bound = min(self.port_utility[port] for port in options)
            if not _is_feasible(lower_bound):
                return
            if self.best is not None and lower_bound >= self.best.utility:
                return
        degree: dict[str, int] = {}
        for options in rows.values():
            for port in options - selected:
                degree[port] = degree.get(port, 0) + 1
        shared = [port for port, count in degree.items() if count > 1]
        if not shared:
            self._form_candidate(rows)
            return
        # Sorting: the port shared by the most threads first; it reduces the space the most.
        port = min(shared, key=lambda name: (-degree[name], natural_sort_key(name)))
        self._explore(select_port(rows, port), selected | {port})
        self._explore(remove_port(rows, port), selected)

    def _form_candidate(self, rows: dict[str, frozenset[str]]) -> None:
        # In a leaf every option is either selected or on one row only: rows choose independently.
        chosen = frozenset(min(options, key=self._by_utility) for options in rows.values())
        utility = max(self.port_utility[port] for port in chosen)
        if self.best is None or utility < self.best.utility:
            self.best = _GroupChoice(chosen, utility)


def _unserved_reason(rows: Mapping[str, frozenset[str]], profile: AutopipelineProfile) -> str:
    for thread in sorted(rows, key=natural_sort_key):
        if not rows[thread]:
            path = profile.thread(thread).execution_path
            if path:
                ports = ", ".join(sorted(path, key=natural_sort_key))
                return f"every port of thread {thread} is blacklisted ({ports})"
            return f"thread {thread} runs no profiled input port"
    return (
        "no choice puts exactly one new thread on each of these threads' paths with every"
        f" predicted load below {UTILIZATION_LIMIT:.0%}"
    )


def plan_autopipelining(profile: AutopipelineProfile) -> AutopipelinePlan:
    """Section 4: bottleneck selection, solution reduction, candidate formation, selection."""
    missing = _missing_measurements(profile)
    if missing:
        log.warning("autopipelining: no change, measurements missing for %s", ", ".join(missing))
        return AutopipelinePlan.no_insertion(
            f"no change: measurements missing for {', '.join(missing)}"
        )
    bottlenecks = bottleneck_threads(profile)
    if not bottlenecks:
        busiest = min(
            profile.threads, key=lambda thread: (-thread.utilization, natural_sort_key(thread.name))
        )
        return AutopipelinePlan.no_insertion(
            f"no thread is at or above beta {profile.beta:g} (busiest: {busiest.name} at"
            f" {busiest.utilization:g})"
        )
    port_utility = {
        port: predict_insertion(profile, port).utility
        for thread in profile.threads
        for port in thread.execution_path
    }
    insertions: list[Insertion] = []
    unserved: list[UnservedGroup] = []
    matrix = solution_matrix(profile)
    for group in dependent_groups(profile, bottlenecks):
        rows = {thread: matrix[thread] for thread in group}
        best = _GroupSearch(rows, port_utility).best
        if best is None:
            unserved.append(UnservedGroup(group, _unserved_reason(rows, profile)))
        else:
            insertions += [predict_insertion(profile, port) for port in best.ports]
    insertions.sort(key=lambda insertion: natural_sort_key(insertion.operator))
    if not insertions:
        return AutopipelinePlan.no_insertion(
            "no insertion possible: " + "; ".join(group.reason for group in unserved),
            bottlenecks,
            tuple(unserved),
        )
    utility = max(insertion.utility for insertion in insertions)
    most_loaded = max(insertions, key=lambda insertion: insertion.utility)
    served_count = len(bottlenecks) - sum(len(group.threads) for group in unserved)
    reason = (
        f"{len(insertions)} new thread(s) for {served_count} of {len(bottlenecks)} bottleneck"
        f" thread(s); the most loaded thread is predicted at {utility:.2f}, at port"
        f" {most_loaded.operator}"
    )
    if unserved:
        reason += "; not served: " + "; ".join(
            f"{', '.join(group.threads)} ({group.reason})" for group in unserved
        )
    return AutopipelinePlan(tuple(insertions), utility, bottlenecks, tuple(unserved), reason)
