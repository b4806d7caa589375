"""The Spark stages of each micro-batch of a streaming query, from Spark's monitoring REST API.

A micro-batch of a fissure query runs as jobs whose description Spark sets to the query's
`id`, `runId` and `batch = N`: first the job that computes the batch (its stages are the ones the
Spark model prices, in order), then the sink's job. `StageLog.batches(run_id)` returns, per batch,
the wall time (submission to completion) of each completed stage of the first job, and of the
batch's jobs together, so that a calibration can fit each stage where it occurs rather than only
the whole batch.

The REST API is served by the Spark UI, which fissure's sessions turn off: a session meant for a
StageLog needs `STAGE_LOG_CONF` (the UI on, on a free port).

Spark mechanism with no pyspark import: it reads Spark's monitoring REST API of a session.
"""

from __future__ import annotations

import datetime
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# What a session needs for the REST API: the UI on, on any free port.
STAGE_LOG_CONF = {"spark.ui.enabled": "true", "spark.ui.port": "0"}

_BATCH = re.compile(r"^batch = (\d+)$", re.MULTILINE)
_RUN_ID = re.compile(r"^runId = ([0-9a-f-]+)$", re.MULTILINE)


@dataclass(frozen=True)
class BatchStages:
    """One micro-batch's Spark work: its first job's stages and all its jobs' wall time."""

    batch_id: int
    stage_s: tuple[float, ...]  # the computing job's completed stages, in stage order
    jobs_s: float  # the batch's jobs, first submission to last completion


def parse_timestamp(stamp: str) -> float:
    """Seconds since the epoch of a REST time stamp such as 2026-11-24T01:40:27.123GMT."""
    moment = datetime.datetime.strptime(stamp.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f")
    return moment.replace(tzinfo=datetime.timezone.utc).timestamp()


def job_batch(description: str | None, run_id: str) -> int | None:
    """The micro-batch a job belongs to, if its description names the query run `run_id`."""
    if not description:
        return None
    run, batch = _RUN_ID.search(description), _BATCH.search(description)
    if run is None or batch is None or run.group(1) != run_id:
        return None
    return int(batch.group(1))


def group_batches(jobs: Iterable[Mapping], stages: Mapping[int, Mapping], run_id: str) -> dict[int, BatchStages]:
    """Per micro-batch of `run_id`: the REST API's jobs and stages (by id) folded into BatchStages.

    A batch's first job (lowest id) computes it; its skipped or unfinished stages are left out.
    A batch with an unfinished job is left out."""
    by_batch: dict[int, list[Mapping]] = {}
    for job in jobs:
        batch = job_batch(job.get("description"), run_id)
        if batch is not None:
            by_batch.setdefault(batch, []).append(job)
    out = {}
    for batch, batch_jobs in sorted(by_batch.items()):
        if any(not job.get("completionTime") for job in batch_jobs):
            continue
        batch_jobs = sorted(batch_jobs, key=lambda job: job["jobId"])
        stage_s = []
        for stage_id in sorted(batch_jobs[0]["stageIds"]):
            stage = stages.get(stage_id)
            if stage is None or stage.get("status") != "COMPLETE" or not stage.get("completionTime"):
                continue
            stage_s.append(parse_timestamp(stage["completionTime"]) - parse_timestamp(stage["submissionTime"]))
        jobs_s = (max(parse_timestamp(job["completionTime"]) for job in batch_jobs)
                  - min(parse_timestamp(job["submissionTime"]) for job in batch_jobs))
        out[batch] = BatchStages(batch, tuple(stage_s), jobs_s)
    return out


class StageLog:
    """Reads the stages of a running session's streaming queries (the session needs STAGE_LOG_CONF)."""

    def __init__(self, spark) -> None:
        context = spark.sparkContext
        if not context.uiWebUrl:
            raise RuntimeError("the Spark UI is off, so its REST API is too: create the session with "
                               "fissure.spark.session.stage_log.STAGE_LOG_CONF in RunnerConfig.spark_conf")
        self.base = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}"

    def get(self, path: str):
        try:
            with urllib.request.urlopen(self.base + path, timeout=30) as response:
                return json.load(response)
        except (urllib.error.URLError, OSError) as error:
            raise RuntimeError(f"Spark's REST API at {self.base}{path} did not answer: {error}") from None

    def batches(self, run_id: str) -> dict[int, BatchStages]:
        """The finished micro-batches of the query run `run_id` (query.runId), by batch id."""
        jobs = self.get("/jobs")
        stages: dict[int, Mapping] = {}
        for stage in self.get("/stages"):  # a retried stage: its completed attempt
            if stage["stageId"] not in stages or stage.get("status") == "COMPLETE":
                stages[stage["stageId"]] = stage
        return group_batches(jobs, stages, run_id)
