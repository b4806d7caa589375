"""How a run's query ends, for the plain run (fissure.spark.run) and the adaptive run
(fissure.spark.adaptive.loop) alike: `QueryRestarts` starts it again on its checkpoint after the
machine's failure as the run's restart policy allows (fissure.lifecycle.failures decides), and
`check_input_read` raises `RunTimedOut` when a bounded run's timeout ended it with input unread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fissure.lifecycle.failures import Restart, RestartPolicy, decide_restart, restartable_failure
from fissure.spark.checkpoint.files import open_store
from fissure.spark.checkpoint.guard import CheckpointDamaged, StartGuard
from fissure.spark.io.input_left import InputLeft, input_left
from fissure.spark.query.report import RunReport
from fissure.spark.query.runner import Runner

log = logging.getLogger(__name__)


class QueryRestarts:
    """The restarts a run made after failed queries, and whether it makes one more: the policy's
    (fissure.lifecycle.failures.decide_restart) answer, on the run's clock."""

    def __init__(self, policy: RestartPolicy, checkpoint: str, clock: Callable[[], float], lock=None) -> None:
        self.policy, self.checkpoint, self.clock, self.lock = policy, checkpoint, clock, lock
        self.made: list[Restart] = []

    def allows(self, error: BaseException) -> bool:
        """True: start the query again on the checkpoint (logged). False: the run ends with `error`,
        which then carries a `fissure: not restarted: ...` note when it was the machine's failure.
        Raises CheckpointDamaged (from `error`) when the failed query's checkpoint is damaged."""
        damage = checkpoint_damage(self.lock.store) if self.lock is not None else None
        if damage is not None:
            raise damage from error
        failure = restartable_failure(str(error))
        if failure is None:
            return False
        now_s = self.clock()
        decision = decide_restart(failure, self.made, now_s, self.policy)
        if not decision.restart:
            error.add_note(f"fissure: not restarted: {decision.reason}")
            return False
        self.made.append(Restart(now_s, failure))
        log.warning("fissure: the query failed (%s); starting it again on the checkpoint %s", decision.reason,
                    self.checkpoint)
        return True


class RunTimedOut(RuntimeError):
    """A bounded run (available_now=True) that its `timeout_s` ended with input left unread:
    `left` says what (fissure.spark.io.input_left), `report` is the run's report so far. The
    batches committed stay committed: a run on the same checkpoint goes on from there."""

    def __init__(self, message: str, report: RunReport, left: InputLeft) -> None:
        super().__init__(message)
        self.report = report
        self.left = left


def check_input_read(runner: Runner, report: RunReport, timeout_s: float | None) -> None:
    """After a bounded run's timeout: raise RunTimedOut when input is left unread."""
    store = runner_store(runner)
    left = input_left(runner.sources, store) if store is not None else InputLeft(uncounted=tuple(runner.sources))
    if not left.anything_left:
        return
    raise RunTimedOut(f"the run's timeout ({timeout_s:g} s) ended it with input left: {left.describe()}; "
                      f"{report.batches} batch{'' if report.batches == 1 else 'es'} committed. Run again on the same "
                      f"checkpoint to process the rest (or without a timeout; a --follow run's timeout is its end)",
                      report, left)


def runner_store(runner: Runner):
    try:
        return open_store(runner.spark, runner.checkpoint)
    except Exception:  # noqa: BLE001 - no store to read: the input cannot be counted
        return None


def checkpoint_damage(store) -> CheckpointDamaged | None:
    """A failed query's checkpoint checked as a start checks it: a deleted offsets file is named
    as such, not left to Spark's `Multiple streaming jobs detected`."""
    try:
        StartGuard.open(store).check_logs()
    except CheckpointDamaged as damage:
        return damage
    except Exception:  # noqa: BLE001 - unreadable now: the query's own error says more
        return None
    return None
