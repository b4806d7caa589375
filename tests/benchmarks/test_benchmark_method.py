"""The benchmarks' shared method (benchmarks/method.py): ordering, medians, ratios, the tie rule,
the busy verdict and the results header. Pure: no Spark, no timing."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from repository import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import method  # noqa: E402
from method import MethodError  # noqa: E402


class TestOrder:
    def test_rotation_puts_every_variant_in_every_position(self):
        items = ["a", "b", "c"]
        orders = [method.rotated(items, repeat) for repeat in range(3)]
        assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
        for position in range(3):
            assert {order[position] for order in orders} == set(items)

    def test_no_variant_always_first(self):
        firsts = {method.run_order(["seq", "planner", "best"], repeat)[0] for repeat in range(3)}
        assert firsts == {"seq", "planner", "best"}

    def test_shuffle_is_reproducible_from_its_seed(self):
        items = list("abcdefgh")
        assert method.shuffled(items, 5, 2) == method.shuffled(items, 5, 2)
        assert sorted(method.shuffled(items, 5, 2)) == items
        assert any(method.shuffled(items, 5, r) != method.shuffled(items, 5, 0) for r in range(1, 5))

    def test_run_order_shuffles_only_with_a_seed(self):
        assert method.run_order("abc", 1) == ["b", "c", "a"]
        assert method.run_order("abcdef", 3, seed=9) == method.shuffled("abcdef", 9, 3)


class TestRepeats:
    def test_fewer_than_three_repeats_refused(self):
        with pytest.raises(MethodError):
            method.check_repeats(2)
        assert method.check_repeats(3) == 3

    def test_quick_allows_one_repeat(self):
        assert method.check_repeats(1, quick=True) == 1
        with pytest.raises(MethodError):
            method.check_repeats(0, quick=True)

    def test_median(self):
        assert method.median([5.0, 1.0, 3.0]) == 3.0
        assert method.median([4.0, 1.0, None, 2.0]) == 2.0
        with pytest.raises(MethodError):
            method.median([])


class TestBlock:
    def test_warm_up_not_counted_and_orders_rotated(self):
        calls = []

        def variant(label, value):
            def run():
                calls.append(label)
                return value
            return run

        block = method.measure_block({"a": variant("a", 1.0), "b": variant("b", 2.0), "c": variant("c", 4.0)}, 3,
                                     warm_up=lambda: calls.append("warm-up"))
        assert calls[0] == "warm-up" and calls.count("warm-up") == 1
        assert calls[1:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
        assert block.runs == {"a": [1.0] * 3, "b": [2.0] * 3, "c": [4.0] * 3}
        assert block.orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
        assert block.over_best_of_others("c") == (2.0, "b")

    def test_block_refuses_two_repeats_without_quick(self):
        with pytest.raises(MethodError):
            method.measure_block({"a": lambda: 1.0}, 2)
        assert method.measure_block({"a": lambda: 1.0}, 1, quick=True).runs == {"a": [1.0]}

    def test_value_extracts_the_figure_and_keeps_the_result(self):
        block = method.measure_block({"a": lambda: {"rate": 7.0}}, 3, value=lambda result: result["rate"])
        assert block.runs["a"] == [7.0, 7.0, 7.0]
        assert block.details["a"][0] == {"rate": 7.0}


class TestRatios:
    def test_best_of_others_excludes_the_numerator(self):
        values = {"planner": 10.0, "sequential": 5.0, "best": 8.0}
        assert method.over_best_of_others(values, "planner") == (10.0 / 8.0, "best")
        # the planner measuring best gives a ratio above 1, which "best of all" could never give
        assert method.over_best_of_others(values, "planner")[0] > 1

    def test_denominator_containing_the_numerator_refused(self):
        values = {"planner": 10.0, "best": 8.0}
        with pytest.raises(MethodError):
            method.over_best_of_others(values, "planner", among=["planner", "best"])

    def test_ratio_of_a_variant_to_itself_refused(self):
        with pytest.raises(MethodError):
            method.ratio({"a": 1.0}, "a", "a")
        with pytest.raises(MethodError):
            method.paired_ratio({"a": [1.0]}, "a", "a")

    def test_ratio(self):
        assert method.ratio({"a": 3.0, "b": 2.0}, "a", "b") == 1.5
        with pytest.raises(MethodError):
            method.ratio({"a": 3.0, "b": 0.0}, "a", "b")

    def test_paired_ratio_is_the_median_of_per_repeat_ratios(self):
        runs = {"a": [2.0, 4.0, 9.0], "b": [1.0, 4.0, 3.0]}
        assert method.paired_ratio(runs, "a", "b") == 2.0
        with pytest.raises(MethodError):
            method.paired_ratio({"a": [1.0, 2.0], "b": [1.0]}, "a", "b")

    def test_best_of_equal_values_is_not_the_dictionary_order(self):
        assert method.best_of({"z": 1.0, "a": 1.0}, ["z", "a"]) == ("a", 1.0)
        assert method.best_of({"z": 1.0, "a": 1.0}, ["a", "z"]) == ("a", 1.0)


class TestTieRule:
    @staticmethod
    def simplicity(plan):
        threads, regions, pipelines = plan
        return method.plan_simplicity(threads, regions, pipelines, str(plan))

    def test_highest_prediction_wins_outside_the_tolerance(self):
        predicted = {(4, 1, 4): 100.0, (1, 1, 1): 90.0}
        assert method.first_ranked(predicted, self.simplicity) == (4, 1, 4)

    def test_ties_go_to_fewer_threads_whatever_the_order(self):
        first = {(4, 3, 4): 7068.0, (3, 1, 3): 7068.0}
        second = dict(reversed(list(first.items())))
        assert method.first_ranked(first, self.simplicity) == (3, 1, 3)
        assert method.first_ranked(second, self.simplicity) == (3, 1, 3)

    def test_within_the_relative_tolerance_is_a_tie(self):
        predicted = {(4, 1, 4): 100.0, (2, 1, 2): 99.5, (1, 1, 1): 97.0}
        assert method.ties(predicted) == [(4, 1, 4), (2, 1, 2)]
        assert method.first_ranked(predicted, self.simplicity) == (2, 1, 2)
        assert method.first_ranked(predicted, self.simplicity, tolerance=0.05) == (1, 1, 1)

    def test_equal_threads_go_to_fewer_regions_then_pipelines(self):
        assert method.first_ranked({(3, 2, 3): 5.0, (3, 1, 3): 5.0}, self.simplicity) == (3, 1, 3)
        assert method.first_ranked({(3, 1, 3): 5.0, (3, 1, 2): 5.0}, self.simplicity) == (3, 1, 2)

    def test_no_candidates_refused(self):
        with pytest.raises(MethodError):
            method.first_ranked({}, self.simplicity)


class TestBusyVerdict:
    def test_others_share_is_their_cpu_over_the_machines_cpu_time(self):
        # 2 cores for 100 s = 200 CPU s, of which other processes used 20 s
        assert method.others_share(20.0, 100.0, 2) == pytest.approx(0.10)
        assert method.others_share(5.0, 0.0, 2) == 0.0

    def test_a_run_busy_by_itself_is_not_a_busy_machine(self):
        # the benchmark kept the load at 3 on 2 cores; others used 2 % of the CPU
        assert not method.busy(0.02, [0.3, 0.5, 0.5], 2)
        assert method.busy(0.25, [0.3, 0.5, 0.5], 2)

    def test_without_cpu_accounting_the_load_before_decides(self):
        assert method.busy(None, [2.5, 1.0, 1.0], 2)
        assert not method.busy(None, [1.9, 3.0, 3.0], 2)  # the 1-minute average decides

    def test_verdict_text(self):
        assert method.verdict(0.01, [0.5], 2, quick=False) is None
        assert method.BUSY in method.verdict(0.4, [0.5], 2, quick=False)
        assert "40%" in method.verdict(0.4, [0.5], 2, quick=False)
        assert method.BUSY in method.verdict(None, [3.0], 2, quick=False)
        assert method.verdict(0.01, [0.5], 2, quick=True) == method.QUICK
        both = method.verdict(0.4, [0.5], 2, quick=True)
        assert method.BUSY in both and method.QUICK in both

    def test_other_processes_are_neither_the_run_nor_its_descendants_nor_tagged_with_it(self):
        import os
        import subprocess
        import sys as system

        sleeper = [system.executable, "-c", "import time; time.sleep(30)"]
        untagged_env = {key: value for key, value in os.environ.items() if key != method.RUN_TAG}
        # `run` plays the benchmark: a process with a child of its own, untagged
        run = subprocess.Popen([system.executable, "-c", "import subprocess, sys, time; "
                                "child = subprocess.Popen(sys.argv[1:]); print(child.pid, flush=True); time.sleep(30)",
                                *sleeper], env=untagged_env, stdout=subprocess.PIPE, text=True)
        tagged = subprocess.Popen(sleeper, env={**untagged_env, method.RUN_TAG: "test-others-cpu"})
        untagged = subprocess.Popen(sleeper, env=untagged_env)
        try:
            run_child = int(run.stdout.readline())
            found = method.processes_cpu_s("test-others-cpu", run.pid)
        finally:
            for process in (run, tagged, untagged):
                process.kill()
            os.kill(run_child, 9)
        assert run.pid not in found and run_child not in found  # the run and its descendants
        assert tagged.pid not in found  # a tagged process, wherever it hangs in the tree
        assert untagged.pid in found and os.getpid() in found

    def test_a_process_started_during_the_run_counts_whole_one_running_before_from_its_first_sample(
            self, monkeypatch):
        samples = iter([{1: (50.0, 10.0)},  # availability check
                        {1: (50.0, 10.0)},  # first sample: pid 1 ran before the run (started at 10 s)
                        {1: (53.0, 10.0), 2: (4.0, 1000.0)},  # pid 2 started during the run
                        {1: (54.0, 10.0), 2: (1.0, 1002.0)}])  # pid 2 reused by a new process
        monkeypatch.setattr(method, "processes_cpu_s", lambda tag, pid: next(samples))
        monkeypatch.setattr(method, "seconds_since_boot", lambda: 900.0)
        others = method.OthersCpu("t", 0, interval_s=3600)
        others.sample()
        assert others.seconds() == pytest.approx(4.0 + 4.0 + 1.0)  # pid 1: 54 - 50; pid 2's two processes: 4, 1


    def test_steal_time_is_read_from_the_cpu_line_and_counts_as_taken(self):
        hertz = __import__("os").sysconf("SC_CLK_TCK")
        before = method.steal_and_total_s("cpu  100 0 100 700 0 0 0 100 0 0")
        after = method.steal_and_total_s("cpu  200 0 200 1300 0 0 0 300 0 0")
        assert before == (100 / hertz, 1000 / hertz)
        assert method.steal_share(before, after) == pytest.approx(200 / 1000)
        assert method.steal_and_total_s("intr 1 2 3") is None
        assert method.steal_share(None, after) is None
        # others' 5 % and the hypervisor's 10 %: together a busy machine, and the text says both
        text = method.verdict(0.05, [0.5], 2, quick=False, steal=0.10)
        assert method.BUSY in text and "15%" in text and "the hypervisor 10%" in text
        assert method.verdict(0.05, [0.5], 2, quick=False, steal=0.0) is None

    def test_a_machine_whose_speed_moved_gives_no_result_to_quote(self):
        assert method.speed_change(0.030, 0.036) == pytest.approx(0.2)
        assert method.speed_change(None, 0.03) is None
        assert method.verdict(0.0, [0.5], 2, quick=False, speed_moved=0.05) is None
        slower = method.verdict(0.0, [0.5], 2, quick=False, speed_moved=0.2)
        assert method.SPEED_MOVED in slower and "+20%" in slower
        assert method.SPEED_MOVED in method.verdict(0.0, [0.5], 2, quick=False, speed_moved=-0.15)

    def test_the_calibration_loop_takes_the_same_work_each_time(self):
        short = method.calibration_s(repeats=2, iterations=10_000, pause_s=0.0)
        longer = method.calibration_s(repeats=2, iterations=200_000, pause_s=0.0)
        assert 0 < short < longer

    def test_the_calibration_is_the_best_of_its_repeats_on_the_clock_given_with_pauses_between(self):
        readings = iter([0.0, 0.030, 1.0, 1.020, 2.0, 2.025])  # three loops: 30, 20 and 25 ms
        pauses = []
        best = method.calibration_s(repeats=3, iterations=10, pause_s=0.2, clock=lambda: next(readings),
                                    sleep=pauses.append)
        assert best == pytest.approx(0.020)
        assert pauses == [0.2, 0.2]  # between the loops, not before the first

    def test_the_calibration_runs_in_a_new_python_process(self):
        import subprocess

        commands = []

        def run(command, **options):
            commands.append(command)
            return subprocess.CompletedProcess(command, 0, stdout="0.0152\n", stderr="")

        assert method.calibration_in_fresh_process(run=run, repeats=15, pause_s=0.2) == pytest.approx(0.0152)
        (command,) = commands
        assert command[:2] == [sys.executable, "-c"] and "method.calibration_s(" in command[2]
        assert Path(command[3]) == Path(method.__file__).resolve().parent
        assert command[4:] == ["15", "0.2"]

    def test_a_calibration_process_that_fails_says_why(self):
        import subprocess

        def failing(command, **options):
            return subprocess.CompletedProcess(command, 1, stdout="", stderr="Traceback ...\nMemoryError")

        def silent(command, **options):
            return subprocess.CompletedProcess(command, 0, stdout="", stderr="")

        with pytest.raises(MethodError, match="exit 1.*MemoryError"):
            method.calibration_in_fresh_process(run=failing)
        with pytest.raises(MethodError, match="printed no time"):
            method.calibration_in_fresh_process(run=silent)

    def test_the_calibration_program_runs_as_a_process_of_its_own(self):
        # one short loop, no pause: the program imports this module in a new interpreter and prints a time
        assert method.calibration_in_fresh_process(repeats=1, pause_s=0.0) > 0

    def test_a_run_takes_its_calibration_before_anything_runs_and_again_when_it_writes(self, tmp_path, monkeypatch):
        monkeypatch.setattr(method, "load", lambda: [0.1, 0.1, 0.1])
        monkeypatch.setattr(method.Run, "others_cpu_share", lambda self: 0.0)
        readings = iter([0.010, 0.0125])
        run = method.Run("example.py", [], out=tmp_path, calibrate=lambda: next(readings))
        assert run.calibration_before_s == 0.010
        run.write_results("example", "# Title\n", {})
        header = json.loads((tmp_path / "example.json").read_text())["provenance"]
        assert header["calibration_s"] == {"before": 0.01, "after": 0.0125, "where": "a fresh Python process"}
        assert header["speed_change"] == pytest.approx(0.25)
        assert method.SPEED_MOVED in header["verdict"] and header["quotable"] is False
        assert "a fixed loop in a fresh Python process, before / after): 10.0 ms / 12.5 ms (+25.0%)" in (
            tmp_path / "example.md").read_text()

    def test_a_calibration_that_fails_after_the_run_leaves_no_result_to_quote(self, tmp_path, monkeypatch):
        monkeypatch.setattr(method, "load", lambda: [0.1, 0.1, 0.1])
        monkeypatch.setattr(method.Run, "others_cpu_share", lambda self: 0.0)
        readings = iter([0.010])

        def calibrate():
            try:
                return next(readings)
            except StopIteration:
                raise MethodError("the calibration process failed (exit 1): MemoryError") from None

        run = method.Run("example.py", [], out=tmp_path, calibrate=calibrate)
        run.write_results("example", "# Title\n", {})
        header = json.loads((tmp_path / "example.json").read_text())["provenance"]
        assert header["calibration_s"]["after"] is None and header["speed_change"] is None
        assert method.SPEED_UNKNOWN in header["verdict"] and "MemoryError" in header["verdict"]

    def test_a_runs_header_gives_the_steal_time_between_its_start_and_its_write(self, tmp_path, monkeypatch):
        monkeypatch.setattr(method, "load", lambda: [0.1, 0.1, 0.1])
        monkeypatch.setattr(method.Run, "others_cpu_share", lambda self: 0.02)
        readings = iter([(10.0, 1000.0), (40.0, 1200.0)])  # 30 of 200 CPU seconds stolen during the run
        monkeypatch.setattr(method, "steal_and_total_s", lambda: next(readings))
        run = method.Run("example.py", [], out=tmp_path, calibrate=lambda: 0.010)
        run.write_results("example", "# Title\n", {})
        header = json.loads((tmp_path / "example.json").read_text())["provenance"]
        assert header["steal_share"] == pytest.approx(0.15)
        assert method.BUSY in header["verdict"] and "the hypervisor 15%" in header["verdict"]
        assert "Steal time (CPU the hypervisor gave other guests): 15.0%" in (tmp_path / "example.md").read_text()

    def test_end_spark_stops_the_session_then_ends_its_jvm_and_waits_for_it(self):
        events = []

        class Stdin:
            def close(self):
                events.append("input closed")

        class Jvm:
            pid, stdin = 4242, Stdin()

            def wait(self, timeout):
                events.append("waited")
                return 0

        class Gateway:
            proc = Jvm()

            def shutdown(self):
                events.append("gateway shut down")

        class Context:
            _gateway, _jvm = Gateway(), object()

        class Session:
            sparkContext = Context()

            def stop(self):
                events.append("session stopped")

        method.end_spark(Session())
        assert events == ["session stopped", "gateway shut down", "input closed", "waited"]
        assert Context._gateway is None and Context._jvm is None  # a later session starts a JVM of its own

    def test_end_spark_without_a_jvm_of_its_own_only_stops_the_session(self):
        events = []

        class Context:
            _gateway = None

        class Session:
            sparkContext = Context()

            def stop(self):
                events.append("session stopped")

        method.end_spark(Session())
        assert events == ["session stopped"]

    def test_a_scratch_folder_is_there_inside_its_block_and_gone_after_it(self, monkeypatch, tmp_path):
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        with method.scratch_folder("benchmarks/state_size.py") as scratch:
            assert scratch.is_dir() and scratch.parent == tmp_path
            assert scratch.name.startswith("fissure-state_size-")
            (scratch / "input").mkdir()
            (scratch / "input" / "part-0.txt").write_text("a line\n")
        assert not scratch.exists()

    def test_a_scratch_folder_is_removed_when_its_block_raises(self, monkeypatch, tmp_path):
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        with pytest.raises(RuntimeError, match="the run failed"):
            with method.scratch_folder("state_size.py") as scratch:
                (scratch / "checkpoint").mkdir()
                raise RuntimeError("the run failed")
        assert not scratch.exists()

    def test_a_process_that_ends_between_two_reads_is_not_counted(self, monkeypatch):
        import builtins
        import os

        real_open = builtins.open
        ended = os.getppid()

        def racing_open(path, *args, **kwargs):
            if str(path) == f"/proc/{ended}/environ":
                raise ProcessLookupError(3, "No such process", str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", racing_open)
        assert ended not in method.processes_cpu_s("test-ended", own_pid=os.getpid())

    def test_a_process_whose_environment_cannot_be_read_counts_as_other(self, monkeypatch):
        import builtins
        import os

        real_open = builtins.open
        other = os.getppid()  # stands for another user's process: its environ unreadable

        def guarded_open(path, *args, **kwargs):
            if str(path) == f"/proc/{other}/environ":
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", guarded_open)
        found = method.processes_cpu_s("test-unreadable", own_pid=os.getpid())
        assert other in found  # before: skipped, as if it used no CPU


class TestWriter:
    def test_header_after_the_title_and_in_the_json(self, tmp_path, monkeypatch):
        monkeypatch.setattr(method, "load", lambda: [9.0, 9.0, 9.0])
        monkeypatch.setattr(method.Run, "others_cpu_share", lambda self: 0.5)
        run = method.Run("example.py", ["--repeats", "3"], out=tmp_path, calibrate=lambda: 0.015)
        run.write_results("example", "# Title\n\nbody\n", {"figure": 1.5})
        text = (tmp_path / "example.md").read_text()
        lines = text.splitlines()
        assert lines[0] == "# Title"
        assert "Regenerate: `./dev python benchmarks/example.py --repeats 3`" in text
        assert "Revision: " in text and "Load average before / after: [9.0, 9.0, 9.0]" in text
        assert "Busy machine: not a result to quote" in text
        assert lines[-1] == "body"
        data = json.loads((tmp_path / "example.json").read_text())
        assert data["figure"] == 1.5
        assert data["provenance"]["command"] == "./dev python benchmarks/example.py --repeats 3"
        assert data["provenance"]["quotable"] is False
        assert data["provenance"]["revision"]

    def test_quiet_machine_is_quotable(self, tmp_path, monkeypatch):
        monkeypatch.setattr(method, "load", lambda: [0.1, 0.1, 0.1])
        monkeypatch.setattr(method.Run, "others_cpu_share", lambda self: 0.02)
        run = method.Run("example.py", [], out=tmp_path, calibrate=lambda: 0.015)
        run.write_results("example", "# Title\n", {})
        assert json.loads((tmp_path / "example.json").read_text())["provenance"]["quotable"] is True
        assert "not a result to quote" not in (tmp_path / "example.md").read_text()

    def test_quick_run_goes_to_a_temporary_folder(self, monkeypatch):
        monkeypatch.setattr(method, "load", lambda: [0.1, 0.1, 0.1])
        run = method.Run("example.py", ["--quick"], quick=True, calibrate=lambda: 0.015)
        assert run.out != method.RESULTS


def test_a_revision_is_dirty_when_code_changed_not_when_results_were_written(tmp_path):
    import subprocess

    from provenance import revision

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results" / "cost.md").write_text("old\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    assert not revision(tmp_path).endswith("(dirty)")
    (tmp_path / "benchmarks" / "results" / "cost.md").write_text("new\n")
    assert not revision(tmp_path).endswith("(dirty)")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert revision(tmp_path).endswith("(dirty)")


class TestPointProcess:
    def test_the_last_stdout_line_is_the_result(self):
        script = "print('warming up'); import json; print(json.dumps({'rate': 3}))"
        assert method.run_point_process(script, "a point") == {"rate": 3}

    def test_a_failed_process_names_what_failed_with_its_error(self):
        with pytest.raises(SystemExit, match="(?s)a point failed:.*ZeroDivisionError"):
            method.run_point_process("1 / 0", "a point")
