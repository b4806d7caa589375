"""benchmarks/cost.py's own logic, without Spark: a run whose answer on the check input is not the
direct loop's is left out with the reason, and the report shows the left-out runs beside the
measured ones."""

from __future__ import annotations

import sys

from repository import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import cost  # noqa: E402
import direct_loops  # noqa: E402
import peers  # noqa: E402


def word_workload(tmp_path) -> cost.Workload:
    source = direct_loops.write_input("wordcount", tmp_path, records=50, files=2, files_per_batch=1, vocabulary=40)
    paths = direct_loops.input_files(tmp_path)
    return cost.Workload("wordcount-test", "wordcount", paths, direct_loops.count_records(paths), source, paths, source,
                         direct_loops.programs("wordcount"))


def test_a_run_that_answers_otherwise_is_left_out_with_the_difference(tmp_path, monkeypatch):
    workload = word_workload(tmp_path)
    workload.runs = {"bytewax": ("peer", "bytewax")}
    right = direct_loops.direct_answer("wordcount", workload.check_paths)
    word = sorted(right)[0]
    wrong = [{"word": key, "count": number + (key == word)} for key, number in right.items()]
    monkeypatch.setattr(peers, "bytewax_output", lambda family, paths: wrong)
    cost.check_runs(None, workload)
    assert workload.runs == {}
    assert f"1 of {len(right)} keys differ" in workload.skipped["bytewax"]


def test_a_run_that_answers_alike_stays(tmp_path, monkeypatch):
    workload = word_workload(tmp_path)
    workload.runs = {"bytewax": ("peer", "bytewax")}
    right = direct_loops.direct_answer("wordcount", workload.check_paths)
    monkeypatch.setattr(peers, "bytewax_output",
                        lambda family, paths: [{"word": key, "count": n} for key, n in right.items()])
    cost.check_runs(None, workload)
    assert workload.runs == {"bytewax": ("peer", "bytewax")} and workload.skipped == {}


def test_a_run_that_fails_is_left_out_with_its_error(tmp_path, monkeypatch):
    workload = word_workload(tmp_path)
    workload.runs = {"bytewax": ("peer", "bytewax")}

    def fails(family, paths):
        raise RuntimeError("worker lost\nmore")

    monkeypatch.setattr(peers, "bytewax_output", fails)
    cost.check_runs(None, workload)
    assert workload.skipped["bytewax"] == "failed on the check input: RuntimeError: worker lost"


def test_report_gives_ratios_to_the_direct_loop_and_the_runs_left_out():
    rates = {cost.DIRECT: [100.0, 200.0, 300.0], cost.DIRECT_BEFORE: [110.0, 210.0, 290.0],
             cost.DIRECT_AFTER: [90.0, 190.0, 310.0], "planner": [50.0, 50.0, 150.0]}
    document = {"files": 5, "files_per_batch": 1, "workloads": {"wordcount-10k": {
        "family": "wordcount", "records": 1000, "planner_plans": {"": "[words,count]x2(word)"}, "rates": rates,
        "skipped": {"planner, aggregate": "no results, against 7"},
        "over_direct": {"planner": cost.method.paired_ratio(rates, "planner", cost.DIRECT)}}}}
    text = cost.report(document)
    assert "| planner | 50 | 0.500 | fissure (`fissure.run`), the planner's plan, the running count per occurrence |" in text
    assert "| direct (before) | 210 |  | the direct loop, run before the others |" in text
    assert "| planner, aggregate | not measured | | no results, against 7 |" in text
