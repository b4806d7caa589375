"""The in-worker dynamic scheduler and the elastic operator runner: order, backpressure,
suspension, shutdown, failures, and the policy loop on an injected clock."""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fissure.control.thread_level.config import ElasticityConfig
from fissure.control.thread_level.decisions import PeriodMeasurement, ThreadLevelDecision
from fissure.runtime.elastic.runner import ElasticOperatorRunner, SystemCpuUsage, ThreadLevelSample
from fissure.runtime.elastic.scheduler import DynamicScheduler, OperatorFailed, Port, SchedulerConfig, SchedulerStopped


def run_with_deadline(function, deadline_s: float = 20.0):
    """Run `function` on a helper thread; fail the test (instead of hanging it) on a deadlock."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = function()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            outcome["error"] = error

    helper = threading.Thread(target=target, daemon=True)
    helper.start()
    helper.join(deadline_s)
    assert not helper.is_alive(), f"no progress within {deadline_s} s: deadlock"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def wait_for(condition, timeout_s: float = 5.0) -> bool:
    """Poll `condition` until it holds or the timeout passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)
    return condition()


def threads_back_to(count: int) -> bool:
    return wait_for(lambda: threading.active_count() <= count)


class Chain:
    """Ports A -> B -> C -> sink on one scheduler; each port records the items it saw, in order."""

    def __init__(self, scheduler: DynamicScheduler, capacity: int, delay_s: float = 0.0) -> None:
        self.seen: dict[str, list[int]] = {"a": [], "b": [], "c": []}
        self.sink: list[int] = []
        self.sink_lock = threading.Lock()
        self.delay_s = delay_s
        self.c = scheduler.add_port("c", self._stage("c", self._to_sink), capacity)
        self.b = scheduler.add_port("b", self._stage("b", lambda item: scheduler.push(self.c, item)), capacity)
        self.a = scheduler.add_port("a", self._stage("a", lambda item: scheduler.push(self.b, item)), capacity)

    def _stage(self, name, forward):
        def handle(item):
            self.seen[name].append(item)
            if self.delay_s:
                time.sleep(random.random() * self.delay_s)
            forward(item)

        return handle

    def _to_sink(self, item):
        with self.sink_lock:
            self.sink.append(item)


class TestPort:
    def test_push_fails_when_full_and_pop_is_fifo(self):
        port = Port("p", handler=print, capacity=2, reschedule_limit=1)
        assert port.try_push(1) and port.try_push(2) and not port.try_push(3)
        assert [port.pop(), port.pop(), port.pop()] == [(True, 1), (True, 2), (False, None)]

    def test_push_fails_while_another_producer_holds_the_port(self):
        port = Port("p", handler=print, capacity=2, reschedule_limit=1)
        port._producer.acquire()  # noqa: SLF001 - another producer in the middle of a push
        try:
            assert not port.try_push(1)
        finally:
            port._producer.release()  # noqa: SLF001
        assert port.try_push(1)

    def test_consumer_lock_is_exclusive(self):
        port = Port("p", handler=print, capacity=2, reschedule_limit=1)
        assert port.try_lock_consumer()
        assert not port.try_lock_consumer()
        port.unlock_consumer()
        assert port.try_lock_consumer()


class TestDynamicScheduler:
    def test_every_port_sees_its_input_in_order_with_16_threads(self):
        scheduler = DynamicScheduler(SchedulerConfig(queue_capacity=2))
        chain = Chain(scheduler, capacity=2, delay_s=0.0005)
        scheduler.start(16)
        items = list(range(400))

        def feed_and_drain():
            for item in items:
                scheduler.push(chain.a, item)
            return scheduler.shutdown(drain=True, timeout_s=15)

        report = run_with_deadline(feed_and_drain)
        assert report.drained and report.threads_stuck == 0
        assert chain.seen == {"a": items, "b": items, "c": items}
        assert chain.sink == items

    def test_a_full_queue_is_drained_by_the_pushing_thread(self):
        scheduler = DynamicScheduler(SchedulerConfig(queue_capacity=1))
        runners: list[str] = []
        port = scheduler.add_port("slow", lambda item: (runners.append(threading.current_thread().name), time.sleep(0.001)))
        scheduler.start(1)
        for item in range(50):
            scheduler.push(port, item)  # with capacity 1, most pushes find the queue full
        assert scheduler.shutdown(drain=True, timeout_s=10).drained
        assert len(runners) == 50
        assert threading.current_thread().name in runners  # reSchedule ran items here

    def test_no_deadlock_with_full_queues_and_blocking_operators(self):
        scheduler = DynamicScheduler(SchedulerConfig(queue_capacity=1, reschedule_limit=1))
        chain = Chain(scheduler, capacity=1, delay_s=0.002)  # every stage blocks for up to 2 ms
        scheduler.start(16)

        def feed_and_drain():
            for item in range(300):
                scheduler.push(chain.a, item)
            return scheduler.shutdown(drain=True, timeout_s=15)

        assert run_with_deadline(feed_and_drain).drained
        assert chain.sink == list(range(300))

    def test_threads_are_suspended_and_woken_not_destroyed(self):
        scheduler = DynamicScheduler()
        running = 0
        peak = 0
        lock = threading.Lock()

        def work(item):
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
            time.sleep(0.002)
            with lock:
                running -= 1

        ports = [scheduler.add_port(f"p{index}", work) for index in range(8)]
        scheduler.start(8)
        scheduler.set_thread_level(2)
        assert wait_for(lambda: scheduler.level_in_force() == 2)
        for item in range(40):
            scheduler.push(ports[item % 8], item)
        assert scheduler.wait_idle(10)
        assert peak <= 3  # two scheduler threads, plus this thread if it had to run items itself
        scheduler.set_thread_level(6)
        assert scheduler.threads_created() == 8 and scheduler.thread_level == 6
        assert scheduler.shutdown().threads_stopped == 8

    def test_shutdown_without_drain_stops_promptly_and_reports_what_it_dropped(self):
        scheduler = DynamicScheduler(SchedulerConfig(queue_capacity=100))
        port = scheduler.add_port("slow", lambda item: time.sleep(0.01))
        scheduler.start(1)
        for item in range(60):
            scheduler.push(port, item)
        started = time.monotonic()
        report = scheduler.shutdown(drain=False)
        assert time.monotonic() - started < 2
        assert not report.drained and report.discarded_items > 40
        assert report.threads_stopped == 1 and report.threads_stuck == 0
        with pytest.raises(SchedulerStopped, match="shut down"):
            scheduler.push(port, 0)

    def test_ports_must_be_added_before_start(self):
        scheduler = DynamicScheduler()
        scheduler.start(1)
        with pytest.raises(RuntimeError, match="before start"):
            scheduler.add_port("late", print)
        scheduler.shutdown()


def double(value: int) -> int:
    return 2 * value


class TestElasticOperatorRunner:
    def test_order_preserved_with_16_threads_and_random_delays(self):
        def slow_double(value: int) -> int:
            time.sleep(random.random() * 0.001)
            return 2 * value

        runner = ElasticOperatorRunner(slow_double, static_threads=16, config=ElasticityConfig(max_threads=16))
        out = run_with_deadline(lambda: list(runner.run(range(2000))))
        assert out == [2 * value for value in range(2000)]

    @settings(max_examples=25, deadline=None)
    @given(
        st.lists(st.integers(-1000, 1000), max_size=120),
        st.integers(1, 8),
        st.integers(1, 6),
        st.integers(1, 3),
        st.integers(2, 7),
    )
    def test_selective_operator_keeps_order_under_any_level_and_capacity(
        self, values, level, capacity, in_flight_factor, modulus
    ):
        def keep_some(value: int):
            if random.random() < 0.3:
                time.sleep(0.0002)
            return value * 3 if value % modulus else None

        runner = ElasticOperatorRunner(
            keep_some,
            selective=True,
            static_threads=level,
            config=ElasticityConfig(max_threads=8),
            queue_capacity=capacity,
            max_in_flight=in_flight_factor * level,
        )
        out = run_with_deadline(lambda: list(runner.run(values)))
        assert out == [value * 3 for value in values if value % modulus]

    def test_operators_that_must_run_at_the_same_time_complete_with_tiny_queues(self):
        barrier = threading.Barrier(4, timeout=10)

        def meet(value: int) -> int:
            barrier.wait()  # blocks until four calls are in the operator at once
            return value

        runner = ElasticOperatorRunner(
            meet, static_threads=4, config=ElasticityConfig(max_threads=4), queue_capacity=1, max_in_flight=8
        )
        assert run_with_deadline(lambda: list(runner.run(range(40)))) == list(range(40))

    def test_an_operator_failure_surfaces_with_its_cause_and_stops_the_threads(self):
        def fragile(value: int) -> int:
            if value == 37:
                raise ValueError("bad record 37")
            return value

        runner = ElasticOperatorRunner(fragile, name="enrich", static_threads=4, config=ElasticityConfig(max_threads=4))
        before = threading.active_count()
        with pytest.raises(OperatorFailed, match=r"enrich.*ValueError: bad record 37") as caught:
            run_with_deadline(lambda: list(runner.run(range(100))))
        assert isinstance(caught.value.__cause__, ValueError)
        assert threads_back_to(before)

    def test_closing_the_generator_early_stops_the_threads(self):
        runner = ElasticOperatorRunner(double, static_threads=4, config=ElasticityConfig(max_threads=4))
        before = threading.active_count()
        results = runner.run(range(10_000))
        assert [next(results) for _ in range(5)] == [0, 2, 4, 6, 8]
        results.close()
        assert threads_back_to(before)

    def test_threads_park_between_runs_and_are_reused(self):
        with ElasticOperatorRunner(double, static_threads=4, config=ElasticityConfig(max_threads=4)) as runner:
            assert list(runner.run(range(100))) == [2 * value for value in range(100)]
            scheduler = runner._scheduler  # noqa: SLF001 - the same threads must serve the next run
            assert runner.thread_level == 0 and scheduler.threads_created() == 4
            assert wait_for(lambda: scheduler.level_in_force() == 0)  # all parked: none polls for work
            assert list(runner.run(range(50, 80))) == [2 * value for value in range(50, 80)]
            assert runner._scheduler is scheduler and scheduler.threads_created() == 4  # noqa: SLF001
        assert runner._scheduler is None  # noqa: SLF001 - closed by the with block

    def test_a_dropped_runner_stops_its_threads(self):
        before = threading.active_count()
        runner = ElasticOperatorRunner(double, static_threads=3, config=ElasticityConfig(max_threads=3))
        assert sum(runner.run(range(10))) == 90
        del runner
        assert threads_back_to(before)

    def test_static_threads_outside_the_configured_levels_is_refused(self):
        with pytest.raises(ValueError, match="static_threads must be in 1..4"):
            ElasticOperatorRunner(double, static_threads=5, config=ElasticityConfig(max_threads=4))


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class RecordingPolicy:
    """A policy that records what it was shown and follows a script of levels."""

    name = "scripted"

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.seen: list[PeriodMeasurement] = []
        self._level = 1

    @property
    def level(self) -> int:
        return self._level

    def decide(self, measurement: PeriodMeasurement) -> ThreadLevelDecision:
        self.seen.append(measurement)
        previous = self._level
        self._level = self.script[min(len(self.seen), len(self.script)) - 1]
        return ThreadLevelDecision.move(previous, self._level, measurement.now_s, f"script step {len(self.seen)}")


class TestPolicyLoop:
    def test_each_period_of_the_injected_clock_is_measured_decided_and_applied(self):
        clock = FakeClock()
        policy = RecordingPolicy([2, 5, 3, 3])
        applied: list[int] = []
        config = ElasticityConfig(max_threads=8, period_s=1.0)
        runner = ElasticOperatorRunner(
            double, policy=policy, config=config, clock=clock, cpu_usage=lambda: 0.25, max_in_flight=4,
            on_period=lambda sample: applied.append(runner.thread_level),
        )

        def source():
            for value in range(500):
                clock.now_s = value / 100  # 100 items per second of the fake clock
                yield value

        assert run_with_deadline(lambda: list(runner.run(source()))) == [2 * value for value in range(500)]
        timeline = runner.timeline
        assert [sample.next_level for sample in timeline] == [2, 5, 3, 3]
        assert [sample.level for sample in timeline] == [1, 2, 5, 3]
        assert applied == [2, 5, 3, 3]  # the scheduler runs at the decided level right after
        assert all(isinstance(sample, ThreadLevelSample) for sample in timeline)
        assert timeline[0].reason == "script step 1" and timeline[0].cpu_usage == 0.25
        for measurement in policy.seen:  # 100 items per second, give or take what is in flight
            assert measurement.throughput_per_s == pytest.approx(100, abs=6)
            assert measurement.cpu_usage == 0.25

    def test_a_period_spans_runs_shorter_than_itself_and_the_gaps_do_not_count(self):
        clock = FakeClock()
        policy = RecordingPolicy([2, 2, 2])
        runner = ElasticOperatorRunner(double, policy=policy, config=ElasticityConfig(max_threads=4), clock=clock,
                                       cpu_usage=lambda: None)

        def task(first: int):  # a 0.4 s task of 40 items
            for value in range(first, first + 40):
                clock.now_s += 0.01
                yield value

        with runner:
            for first in (0, 40, 80, 120):
                assert list(runner.run(task(first))) == [2 * value for value in range(first, first + 40)]
                clock.now_s += 30.0  # Spark busy elsewhere between tasks
        assert len(policy.seen) == 1  # 1.6 s inside runs: one period of 1 s, and one unfinished
        assert policy.seen[0].throughput_per_s == pytest.approx(100, rel=0.1)
        assert runner.timeline[0].period_s == pytest.approx(1.0, abs=0.02)

    def test_a_real_policy_finds_the_best_level_of_a_simulated_service(self):
        # The fake clock advances by 1 / f(level) per item: the runner measures f(level).
        clock = FakeClock()
        config = ElasticityConfig(max_threads=16, period_s=1.0)
        runner = ElasticOperatorRunner(double, policy="trust-trend", config=config, clock=clock, cpu_usage=lambda: None,
                                       max_in_flight=2)
        rate_at = {level: 100.0 * min(level, 6) * (1 - 0.03 * max(0, level - 6)) for level in range(1, 17)}

        def source():
            for value in range(12_000):
                clock.now_s += 1 / rate_at[max(runner.thread_level, 1)]
                yield value

        run_with_deadline(lambda: sum(1 for _ in runner.run(source())), deadline_s=60)
        levels = [sample.level for sample in runner.timeline]
        settled = max(set(levels[-len(levels) // 4 :]), key=levels[-len(levels) // 4 :].count)
        assert rate_at[settled] >= 0.95 * max(rate_at.values())


class TestSystemCpuUsage:
    def test_busy_share_between_two_reads(self, tmp_path):
        stat = tmp_path / "stat"
        stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
        usage = SystemCpuUsage(str(stat))
        stat.write_text("cpu  250 0 150 900 0 0 0 0 0 0\n")  # +200 busy, +100 idle
        assert usage() == pytest.approx(200 / 300)

    def test_unreadable_stat_means_unknown(self, tmp_path):
        assert SystemCpuUsage(str(tmp_path / "missing"))() is None
