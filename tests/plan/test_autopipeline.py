"""The autopipelining optimizer (Tang and Gedik, TPDS 2013, Sections 3-4) and its command."""

from __future__ import annotations

import itertools
import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fissure.cli as cli
from fissure.cli.autopipeline_cmd import load_profile
from fissure.plan.autopipeline import (
    AutopipelineProfile,
    Insertion,
    PredictedLoad,
    ThreadProfile,
    UnservedGroup,
    plan_autopipelining,
    predict_insertion,
    remove_port,
    select_port,
    solution_matrix,
)
from repository import EXAMPLES

EXAMPLE = EXAMPLES / "autopipeline_profile.json"


def make_profile(threads: dict, beta: float = 0.8, blacklist: tuple[str, ...] = ()):
    return AutopipelineProfile(
        tuple(ThreadProfile(name, load, ports) for name, (load, ports) in threads.items()),
        beta,
        frozenset(blacklist),
    )


def profile_threads(profile: AutopipelineProfile) -> dict:
    return {t.name: (t.utilization, dict(t.port_utilization)) for t in profile.threads}


def paper_profile(beta: float = 0.8, blacklist: tuple[str, ...] = ()) -> AutopipelineProfile:
    """Fig. 4 and the matrix of Section 4.1 (sources o0, o2, o5, o7 left out, as the paper does)."""
    return make_profile(
        {
            "t0": (0.90, {"o1": 0.15, "o3": 0.50, "o4": 0.20}),
            "t1": (1.00, {"o3": 0.50, "o4": 0.20}),
            "t2": (0.90, {"o6": 0.30, "o4": 0.15, "o10": 0.05}),
            "t3": (0.95, {"o8": 0.60, "o9": 0.30, "o10": 0.20}),
        },
        beta,
        blacklist,
    )


def operators_of(plan) -> list[str]:
    return [insertion.operator for insertion in plan.insertions]


# --- the paper's running example -------------------------------------------------------------


def test_example_file_is_the_papers_running_example():
    assert load_profile(EXAMPLE) == paper_profile()


def test_prediction_for_a_port_at_o3_is_the_papers():
    # Section 3.1.1: "when a threaded port is added to operator o3, we predict mu'(t0) = 0.4,
    # mu'(t1) = 0.5, and mu'(t') = 1".
    insertion = predict_insertion(paper_profile(), "o3")
    assert insertion.threads == ("t0", "t1")
    assert [load.load for load in insertion.remaining_loads] == pytest.approx([0.4, 0.5])
    assert insertion.new_thread_load == pytest.approx(1.0)
    assert insertion.utility == pytest.approx(1.0)


def test_utilities_of_o8_and_o9_are_the_papers():
    # Section 4.1, candidate formation: U(o8, t3) = 0.6 against U(o9, t3) = 0.65.
    assert predict_insertion(paper_profile(), "o8").utility == pytest.approx(0.6)
    assert predict_insertion(paper_profile(), "o9").utility == pytest.approx(0.65)


def test_matrix_and_selection_of_o3_are_the_papers():
    matrix = solution_matrix(paper_profile())
    assert matrix == {
        "t0": {"o1", "o3", "o4"},
        "t1": {"o3", "o4"},
        "t2": {"o6", "o4", "o10"},
        "t3": {"o8", "o9", "o10"},
    }
    # Fig. 5, edge S3: the first two rows keep only o3; o1 and o4 leave every row.
    assert select_port(matrix, "o3") == {
        "t0": {"o3"},
        "t1": {"o3"},
        "t2": {"o6", "o10"},
        "t3": {"o8", "o9", "o10"},
    }
    # Edges R3 then R4: t1 is left with no port, the case the paper prunes.
    assert remove_port(remove_port(matrix, "o3"), "o4")["t1"] == frozenset()


def test_running_example_gives_the_papers_answer():
    # Section 4.1: C = {<o4, t0>, <o4, t1>, <o4, t2>, <o8, t3>} with aggregate utility 0.8.
    plan = plan_autopipelining(paper_profile())
    assert plan.insertions == (
        Insertion(
            "o4",
            ("t0", "t1", "t2"),
            (
                PredictedLoad("t0", 0.9 - 0.2),
                PredictedLoad("t1", 1.0 - 0.2),
                PredictedLoad("t2", 0.9 - 0.15),
            ),
            0.2 + 0.2 + 0.15,
        ),
        Insertion("o8", ("t3",), (PredictedLoad("t3", 0.95 - 0.6),), 0.6),
    )
    assert plan.utility == pytest.approx(0.8)
    assert plan.bottleneck_threads == ("t0", "t1", "t2", "t3")
    assert plan.unserved_groups == ()


def test_beta_above_a_threads_utilization_leaves_it_out():
    # Section 4.1: with beta = 0.92, t0 and t2 are not bottlenecks. A port still relieves every
    # thread that runs it, so o4 is reported with t0 and t2.
    plan = plan_autopipelining(paper_profile(beta=0.92))
    assert plan.bottleneck_threads == ("t1", "t3")
    assert operators_of(plan) == ["o4", "o8"]
    assert plan.insertions[0].threads == ("t0", "t1", "t2")
    assert plan.utility == pytest.approx(0.8)


def test_blacklisted_port_is_never_chosen():
    plan = plan_autopipelining(paper_profile(blacklist=("o8",)))
    assert operators_of(plan) == ["o4", "o9"]
    assert plan.utility == pytest.approx(0.8)


def test_blacklisting_o4_leaves_t1_only_a_saturating_port():
    # t1 keeps only o3, whose new thread would carry t0's and t1's 50 % each: 100 %, pruned.
    plan = plan_autopipelining(paper_profile(blacklist=("o4",)))
    assert plan.insertions == ()
    assert plan.utility is None
    assert plan.unserved_groups == (
        UnservedGroup(
            ("t0", "t1", "t2", "t3"),
            "no choice puts exactly one new thread on each of these threads' paths with every"
            " predicted load below 100%",
        ),
    )


# --- the rules, one by one -------------------------------------------------------------------


def test_insertion_predicted_at_100_percent_is_pruned():
    only_whole_thread = make_profile({"t0": (1.0, {"a": 1.0})})
    assert plan_autopipelining(only_whole_thread).insertions == ()
    with_half = make_profile({"t0": (1.0, {"a": 1.0, "b": 0.5})})
    assert operators_of(plan_autopipelining(with_half)) == ["b"]


def test_dependent_threads_are_served_all_or_none_and_independent_ones_alone():
    # t0 and t1 share port s, blacklisted: t1 has nothing left, so t0 is not served either,
    # though port a would relieve it. t2 shares nothing with them and is served.
    profile = make_profile(
        {
            "t0": (0.9, {"a": 0.4, "s": 0.3}),
            "t1": (0.9, {"s": 0.3}),
            "t2": (0.9, {"b": 0.45}),
        },
        blacklist=("s",),
    )
    plan = plan_autopipelining(profile)
    assert operators_of(plan) == ["b"]
    assert plan.utility == pytest.approx(0.45)
    assert plan.unserved_groups == (
        UnservedGroup(("t0", "t1"), "every port of thread t1 is blacklisted (s)"),
    )


def test_two_new_threads_never_share_a_bottleneck_path():
    # Each thread's cheapest port, a for t0 and c for t1, would put two new threads on t0's
    # path (c runs on it too). The shared port c alone serves both threads.
    profile = make_profile(
        {
            "t0": (0.9, {"a": 0.45, "c": 0.35}),
            "t1": (0.9, {"c": 0.3, "d": 0.2}),
        }
    )
    plan = plan_autopipelining(profile)
    assert operators_of(plan) == ["c"]
    assert plan.utility == pytest.approx(0.65)
    without_c = make_profile(profile_threads(profile), blacklist=("c",))
    assert operators_of(plan_autopipelining(without_c)) == ["a", "d"]
    assert plan_autopipelining(without_c).utility == pytest.approx(0.7)


def test_no_bottleneck_means_no_insertion_and_names_the_busiest_thread():
    plan = plan_autopipelining(make_profile({"t0": (0.5, {"a": 0.2}), "t1": (0.7, {"b": 0.3})}))
    assert plan.insertions == ()
    assert plan.reason == "no thread is at or above beta 0.8 (busiest: t1 at 0.7)"


def test_missing_measurement_means_no_change_and_a_log_line(caplog):
    profile = make_profile({"t0": (0.9, {"a": math.nan, "b": 0.4})})
    with caplog.at_level(logging.WARNING, logger="fissure.plan.autopipeline"):
        plan = plan_autopipelining(profile)
    assert plan.insertions == () and plan.utility is None
    assert plan.reason == "no change: measurements missing for thread t0 port a"
    assert "thread t0 port a" in caplog.text


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: ThreadProfile("t0", 1.5), r"thread 't0': utilization 1.5 is outside \[0, 1\]"),
        (lambda: ThreadProfile("t0", 0.5, {"a": -0.1}), r"port 'a': utilization -0.1 is outside"),
        (lambda: ThreadProfile("t0", 0.5, {"a": 0.6}), r"port 'a': utilization 0.6 exceeds"),
        (lambda: AutopipelineProfile(()), "no threads"),
        (lambda: make_profile({"t0": (0.5, {})}, beta=1.2), r"beta must be a number in \[0, 1\]"),
        (
            lambda: AutopipelineProfile((ThreadProfile("t0", 0.5), ThreadProfile("t0", 0.6))),
            "repeated: t0",
        ),
    ],
)
def test_invalid_profiles_are_refused_with_the_field_at_fault(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# --- exactness against brute force, straight from the definition -----------------------------


def execution_paths(profile: AutopipelineProfile) -> dict[str, set[str]]:
    return {
        t.name: {port for port, load in t.port_utilization.items() if load > 0}
        for t in profile.threads
    }


def brute_force(profile: AutopipelineProfile):
    """Every choice of a port or nothing per bottleneck thread; returns (served, utility).

    Valid: a served thread's path holds its own choice and no other chosen port, an unserved
    thread's path holds none, two threads whose paths meet are served both or neither, and every
    chosen port's utility (largest predicted load) is below 1. Best: the most threads served,
    then the smallest largest utility.
    """
    paths = execution_paths(profile)

    def utility(port: str) -> float:
        through = [t for t in profile.threads if port in paths[t.name]]
        new_thread = sum(t.port_utilization[port] for t in through)
        return max([new_thread] + [t.utilization - t.port_utilization[port] for t in through])

    bottlenecks = [t.name for t in profile.threads if t.utilization >= profile.beta]
    options = [sorted(paths[name] - profile.blacklisted_ports) + [None] for name in bottlenecks]
    best_served, best_utility = frozenset(), None
    for choice in itertools.product(*options):
        chosen = {port for port in choice if port is not None}
        if any(
            paths[name] & chosen != ({port} if port else set())
            for name, port in zip(bottlenecks, choice)
        ):
            continue
        if any(
            paths[a] & paths[b] and (port_a is None) != (port_b is None)
            for (a, port_a), (b, port_b) in itertools.combinations(zip(bottlenecks, choice), 2)
        ):
            continue
        aggregate = max((utility(port) for port in chosen), default=None)
        if aggregate is not None and aggregate >= 1.0 - 1e-9:
            continue
        served = frozenset(name for name, port in zip(bottlenecks, choice) if port is not None)
        if len(served) > len(best_served) or (
            len(served) == len(best_served) and aggregate is not None and aggregate < best_utility
        ):
            best_served, best_utility = served, aggregate
    return best_served, best_utility


GRID = 20  # utilizations in steps of 5 %


@st.composite
def small_profiles(draw) -> AutopipelineProfile:
    """Any small profile, or (half the time) a busy one: bottleneck threads sharing light ports."""
    busy = draw(st.booleans())
    operators = [f"o{index}" for index in range(draw(st.integers(3 if busy else 1, 6)))]
    threads = []
    for index in range(draw(st.integers(2 if busy else 1, 4))):
        load = draw(st.integers(16, GRID) if busy else st.integers(0, GRID))
        port_loads = st.integers(1, 8) if busy else st.integers(0, load)
        ports = draw(st.dictionaries(st.sampled_from(operators), port_loads))
        port_utilization = {port: value / GRID for port, value in ports.items()}
        threads.append(ThreadProfile(f"t{index}", load / GRID, port_utilization))
    beta = draw(st.integers(10 if busy else 0, 16 if busy else GRID)) / GRID
    blacklist = draw(st.frozensets(st.sampled_from(operators), max_size=1 if busy else 2))
    return AutopipelineProfile(tuple(threads), beta, blacklist)


@settings(max_examples=400, deadline=None)
@given(small_profiles())
def test_answer_is_the_brute_force_optimum(profile):
    plan = plan_autopipelining(profile)
    expected_served, expected_utility = brute_force(profile)
    unserved = {name for group in plan.unserved_groups for name in group.threads}
    assert set(plan.bottleneck_threads) - unserved == expected_served
    if expected_utility is None:
        assert plan.insertions == () and plan.utility is None
    else:
        assert plan.utility == pytest.approx(expected_utility, abs=1e-12)


@settings(max_examples=400, deadline=None)
@given(small_profiles())
def test_when_every_bottleneck_can_be_served_the_answer_is_the_minimum_over_full_choices(profile):
    # The definition, after the autopipelining paper (Tang and Gedik): the minimum over all choices
    # of one port per bottleneck thread.
    paths = execution_paths(profile)
    bottlenecks = [t.name for t in profile.threads if t.utilization >= profile.beta]
    full_choice_utilities = []
    options = [sorted(paths[name] - profile.blacklisted_ports) for name in bottlenecks]
    for choice in itertools.product(*options):
        if bottlenecks and all(paths[n] & set(choice) == {p} for n, p in zip(bottlenecks, choice)):
            aggregate = max(predict_insertion(profile, port).utility for port in set(choice))
            if aggregate < 1.0 - 1e-9:
                full_choice_utilities.append(aggregate)
    plan = plan_autopipelining(profile)
    if full_choice_utilities:
        assert plan.unserved_groups == ()
        assert plan.utility == pytest.approx(min(full_choice_utilities), abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(small_profiles())
def test_insertions_respect_the_rules(profile):
    plan = plan_autopipelining(profile)
    inserted = set(operators_of(plan))
    assert not inserted & profile.blacklisted_ports
    unserved = {name for group in plan.unserved_groups for name in group.threads}
    for name in plan.bottleneck_threads:
        on_path = inserted & profile.thread(name).execution_path
        assert len(on_path) == (0 if name in unserved else 1)
    for insertion in plan.insertions:
        assert insertion.utility < 1.0
        assert insertion == predict_insertion(profile, insertion.operator)
    if plan.insertions:
        assert plan.utility == max(insertion.utility for insertion in plan.insertions)


@settings(max_examples=200, deadline=None)
@given(small_profiles(), st.randoms(use_true_random=False))
def test_answer_does_not_depend_on_the_order_of_threads(profile, random):
    shuffled = list(profile.threads)
    random.shuffle(shuffled)
    reordered = AutopipelineProfile(tuple(shuffled), profile.beta, profile.blacklisted_ports)
    assert plan_autopipelining(reordered) == plan_autopipelining(profile)


# --- the command -----------------------------------------------------------------------------


@pytest.fixture
def run_command(monkeypatch, capsys):
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", ("fissure.cli.autopipeline_cmd",))

    def run(*argv: str):
        exit_code = cli.main(["autopipeline", *argv])
        captured = capsys.readouterr()
        return exit_code, captured.out, captured.err

    return run


def write_profile(tmp_path: Path, document) -> str:
    path = tmp_path / "profile.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


def test_command_prints_the_contract_for_the_running_example(run_command):
    exit_code, out, _ = run_command(str(EXAMPLE), "--json")
    assert exit_code == 0
    assert json.loads(out) == {
        "insertions": [
            {"operator": "o4", "threads": ["t0", "t1", "t2"]},
            {"operator": "o8", "threads": ["t3"]},
        ],
        "utility": 0.8,
    }


def test_command_prints_null_utility_when_nothing_can_be_inserted(run_command, tmp_path):
    document = {
        "blacklist": ["a", "o7"],
        "threads": {"t0": {"utilization": 1.0, "ports": {"a": 0.5}}},
    }
    exit_code, out, _ = run_command(write_profile(tmp_path, document), "--json")
    assert exit_code == 0
    assert json.loads(out) == {"insertions": [], "utility": None}


def test_command_without_json_explains_the_answer(run_command):
    exit_code, out, _ = run_command(str(EXAMPLE))
    assert exit_code == 0
    assert "o4  relieves t0, t1, t2; predicted loads new 0.55, t0 0.70, t1 0.80, t2 0.75" in out
    assert "aggregate utility 0.80" in out
    assert "why: " in out


@pytest.mark.parametrize(
    "document, message",
    [
        ({"beta": 0.8}, 'missing "threads"'),
        ({"threads": {"t0": {"utilization": 0.9}}, "betta": 0.8}, "unknown field(s) 'betta'"),
        ({"threads": {"t0": {"utilization": 0.9, "port": {}}}}, "unknown field(s) 'port' in"),
        ({"threads": {"t0": {"ports": {"a": 0.1}}}}, 'thread "t0": missing "utilization"'),
        ({"threads": {"t0": {"utilization": 90}}}, "utilization 90.0 is outside [0, 1]"),
        (
            {"threads": {"t0": {"utilization": 0.9, "ports": {"a": "high"}}}},
            'port "a" must be a number',
        ),
        ({"threads": {}}, "no threads"),
        ({"threads": [], "beta": 0.8}, '"threads" must be a JSON object'),
        ({"threads": {"t0": {"utilization": 0.9}}, "blacklist": "o1"}, "must be a list"),
        ('{"threads": {"t0": {"utilization": NaN}}}', "NaN is not a utilization"),
        ('{"threads": ', "is not valid JSON"),
    ],
)
def test_command_refuses_bad_profiles_with_the_field_at_fault(
    run_command, tmp_path, document, message
):
    exit_code, out, err = run_command(write_profile(tmp_path, document), "--json")
    assert exit_code == 2
    assert out == ""
    assert err.startswith("fissure autopipeline: ")
    assert message in err


def test_command_names_a_missing_file(run_command, tmp_path):
    exit_code, _, err = run_command(str(tmp_path / "absent.json"))
    assert exit_code == 2
    assert "cannot read the profile" in err and "absent.json" in err


def test_module_entry_point_honours_the_contract():
    completed = subprocess.run(
        [sys.executable, "-m", "fissure", "autopipeline", str(EXAMPLE), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(completed.stdout)["utility"] == 0.8
