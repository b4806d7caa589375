"""The Runner's part that prepares its file sources before the query starts: the batch size of a
file source given none (fissure.spark.io.batch_admission, from the operators' costs, measured once
per checkpoint on a sample, fissure.local.cost_sample) and the staging of files still being
written (fissure.spark.io.file_staging)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from fissure.plan.batch_size import BatchCost, SampleDecision, choose_batch_records, model_batch_cost, sample_needed
from fissure.plan.plans import spark_model_for
from fissure.program.operators import OperatorEstimate
from fissure.spark.io.batch_admission import (SAMPLE_RECORD, SourceAdmission, admit_file_sources, first_file,
                                           input_records, needs_size, recorded_sample, sample_record, sample_rows)
from fissure.spark.checkpoint.files import LocalStore
from fissure.spark.io.file_staging import FileStager, SettleRule, poll_interval, staged, staging_applies, staging_path
from fissure.spark.session.create import default_parallelism
from fissure.spark.io.sources import FileSource
from fissure.local.cost_sample import measure_sample_isolated

log = logging.getLogger(__name__)


class SourcePreparation:
    """Mixed into the Runner: its file sources sized and staged at start() (reads the runner's
    sources, graph, plan, estimates, config and spark; sets `stagers`)."""

    def _staged_sources(self, sources: Mapping[str, object], fresh: bool, available_now: bool) -> dict:
        """The file sources read through a staging directory in the checkpoint, which gets each
        file once it is settled and readable (fissure.spark.io.file_staging); the others as given.
        An available-now run first waits for the files still being written."""
        store = self.lock.store
        checkpoint = store.location if isinstance(store, LocalStore) else None
        staged_sources, self.stagers = dict(sources), []
        for name, source in sources.items():
            if not isinstance(source, FileSource):
                continue
            direct = staging_applies(source, checkpoint, fresh, name)
            if direct is not None:
                if source.settle_s is not None:
                    log.warning("fissure: source %s is read as Spark lists it, files still being written included "
                                "(%s)", name, direct)
                continue
            stager = FileStager(name, source.local_path(), staging_path(checkpoint, name), source.format,
                                SettleRule(float(source.settle_s)), source.on_unreadable)
            if available_now:
                stager.stage_all(poll_interval([stager]))
            else:
                stager.poll()
            self.stagers.append(stager)
            staged_sources[name] = staged(source, stager.staging)
        return staged_sources

    def _on_staging_error(self, error: BaseException) -> None:
        self._staging_error = error
        if self.query is not None and self.query.isActive:
            self.query.stop()

    def _sized_sources(self, store, available_now: bool = False):
        """The sources with a batch size on each file source given none (fissure.spark.io.batch_admission);
        `store`: the checkpoint's files (where the measured operator costs are kept);
        `available_now`: the run reads only what the sources hold now."""
        if not any(needs_size(source) for source in self.sources.values()):
            return self.sources, ()  # no model to evaluate, no calibration file to read
        settings = spark_model_for(self.graph)
        cores = default_parallelism(self.spark)
        declared = model_batch_cost(self.graph.operator_stats(self.estimates), self.plan, cores, settings)
        estimates, costs = self._sampled_estimates(store, self._sample_decision(declared, available_now))
        cost = (declared if estimates is self.estimates else
                model_batch_cost(self.graph.operator_stats(estimates), self.plan, cores, settings))
        sources, admissions = admit_file_sources(self.sources, cost, fixed_share=self.config.batch_fixed_share,
                                                 latency_bound_s=self.config.batch_latency_bound_s, costs=costs)
        for admission in admissions:
            log.info("%s", admission.describe())
        return sources, admissions

    def _sample_decision(self, declared: BatchCost, available_now: bool) -> SampleDecision:
        """Whether the operators' costs need measuring before the batches are sized
        (fissure.plan.batch_size.sample_needed): not when the run reads its sources' input
        once and all of it fits in one batch whatever a sample would measure."""
        sized = [source for source in self.sources.values() if needs_size(source)]
        records = choose_batch_records(declared, fixed_share=self.config.batch_fixed_share,
                                       latency_bound_s=self.config.batch_latency_bound_s).records
        reads_once = available_now and len(sized) == len(self.sources)
        counts = [input_records(source, beyond=records) for source in sized] if reads_once else [None]
        total = None if any(count is None for count in counts) else sum(counts)
        return sample_needed(total, records, reads_once)

    def _sampled_estimates(self, store, decision: SampleDecision | None = None
                           ) -> tuple[Mapping[str, OperatorEstimate] | None, str]:
        """Operator estimates for sizing batches: measured on the first records of each file
        source (fissure.local.cost_sample), under the ones the caller gave; and where they came from.
        A program that fails on its sample keeps its declared costs (its batches will say why).

        The sample runs the user's operators (in a forked process of the driver), so it runs once
        per checkpoint and says so: the costs are kept in the checkpoint (`SAMPLE_RECORD`), and a
        later start of the same program on it (a restart after a crash, a resumed run) reads them."""
        if not self.config.batch_sample_costs:
            return self.estimates, SourceAdmission.costs
        waiting = [operator.name for operator in self.graph.operators if operator.hints.waits is not None]
        if waiting:
            return self.estimates, f"{SourceAdmission.costs} (no sample: {', '.join(waiting)} declare waits=)"
        operators = [operator.name for operator in self.graph.operators]
        sample = recorded_sample(store.read(SAMPLE_RECORD), operators)
        if sample is not None:
            kept = sample.describe() + " (at the checkpoint's first start)"
            return {**sample.estimates, **(self.estimates or {})}, kept
        if decision is not None and not decision.needed:
            return self.estimates, f"{SourceAdmission.costs} (no sample: {decision.reason})"
        try:
            rows, schemas, files = {}, {}, []
            for name, source in self.sources.items():
                sampled = sample_rows(source) if isinstance(source, FileSource) else None
                if sampled is not None:
                    rows[name], schemas[name] = sampled
                    files.append(str(first_file(source)))
            if not rows:
                return self.estimates, SourceAdmission.costs
            print(f"fissure: measuring the operators' costs on the first records of {', '.join(files)} to size the "
                  f"micro-batches: runs the program's operators in a separate process, once per checkpoint "
                  f"(off: --no-cost-sample, RunnerConfig(batch_sample_costs=False))", file=sys.stderr)
            sample = measure_sample_isolated(self.graph, rows, schemas)
        except Exception as error:  # noqa: BLE001 - any failure of the user's code or files on the sample
            log.warning("measuring operator costs on a sample failed (%s); batch sizes follow the declared costs",
                        error)
            return self.estimates, f"{SourceAdmission.costs} (measuring them on a sample failed: {error})"
        try:
            store.write(SAMPLE_RECORD, sample_record(sample, operators))
        except OSError as error:  # the costs still serve this start; the next one measures again
            log.warning("could not keep the measured operator costs in the checkpoint (%s)", error)
        return {**sample.estimates, **(self.estimates or {})}, sample.describe()
