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
                         direct_loops.programs("wordcount"), tmp_path)


def hot_items_workload(tmp_path) -> cost.Workload:
    source = direct_loops.write_input("hot-items", tmp_path, records=6_000, files=2, files_per_batch=1)
    paths = direct_loops.input_files(tmp_path)
    workload = cost.Workload("hot-items-test", "hot-items", paths, direct_loops.count_records(paths), source, paths,
                             source, direct_loops.programs("hot-items"), tmp_path)
    workload.runs = {"spark-sql": ("peer", "spark-sql")}
    return workload


def emitted_rows(answer: dict, starts) -> list[dict]:
    """A Spark peer's output rows for the windows starting at `starts`, as its query gives them."""
    return [{"period": start, "auction": answer[start][0], "bids": answer[start][1]} for start in starts]


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


def test_a_peer_that_leaves_the_last_windows_open_is_checked_on_the_windows_it_emitted(tmp_path, monkeypatch):
    workload = hot_items_workload(tmp_path)
    right = direct_loops.direct_answer("hot-items", workload.check_paths)
    starts = sorted(right)
    assert len(starts) == 6  # 6,000 bids, 0.01 s of event time each: six 10-second windows
    monkeypatch.setattr(peers, "spark_peer_output",
                        lambda spark, family, peer, source, checkpoint: emitted_rows(right, starts[:4]))
    cost.check_runs(None, workload)
    assert workload.runs == {"spark-sql": ("peer", "spark-sql")} and workload.skipped == {}
    assert workload.notes["spark-sql"] == ("its answer on the check input: the direct loop's first 4 windows of 6; "
                                           "the last 2 stayed open (append mode)")


def test_a_peer_missing_a_window_before_its_last_is_left_out(tmp_path, monkeypatch):
    workload = hot_items_workload(tmp_path)
    right = direct_loops.direct_answer("hot-items", workload.check_paths)
    starts = sorted(right)
    monkeypatch.setattr(peers, "spark_peer_output",
                        lambda spark, family, peer, source, checkpoint: emitted_rows(right, starts[:1] + starts[2:4]))
    cost.check_runs(None, workload)
    assert workload.runs == {} and "1 of 4 keys differ" in workload.skipped["spark-sql"]


def test_a_peer_whose_emitted_window_differs_is_left_out(tmp_path, monkeypatch):
    workload = hot_items_workload(tmp_path)
    right = direct_loops.direct_answer("hot-items", workload.check_paths)
    starts = sorted(right)
    rows = emitted_rows(right, starts[:4])
    rows[0]["bids"] += 1
    monkeypatch.setattr(peers, "spark_peer_output", lambda spark, family, peer, source, checkpoint: rows)
    cost.check_runs(None, workload)
    assert workload.runs == {} and "keys differ" in workload.skipped["spark-sql"]


def test_report_gives_a_peer_of_the_family_its_own_description_and_its_check_note():
    rates = {cost.DIRECT: [100.0, 200.0, 300.0], cost.DIRECT_BEFORE: [110.0, 210.0, 290.0],
             cost.DIRECT_AFTER: [90.0, 190.0, 310.0], "spark-sql": [40.0, 80.0, 120.0]}
    document = {"files": 5, "files_per_batch": 1, "workloads": {"hot-items": {
        "family": "hot-items", "records": 1000, "planner_plans": {"": "[parse]"}, "rates": rates, "skipped": {},
        "notes": {"spark-sql": "the last 2 stayed open (append mode)"},
        "over_direct": {"spark-sql": cost.method.paired_ratio(rates, "spark-sql", cost.DIRECT)}}}}
    text = cost.report(document)
    assert ("| spark-sql | 80 | 0.400 | Spark's own operators: from_json, a count per auction and 10-second window, "
            "then per window the auction with the most bids (append mode); the last 2 stayed open (append mode) |"
            in text)
