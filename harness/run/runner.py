"""One `kvbench run`: for each KV-cache dtype, a vLLM server (started here, or an --endpoint checked against
what it says it runs), its capacity three ways, an SLO search and fixed-load phases, with /metrics and
NVML alongside; one typed record (kvbench/records/), flushed after every dtype, with its samples in Parquet.

`execute(plan)` is the one entry point (the CLI, the asv suite and the nightly all call it): it owns the
event loop, SIGTERM, the deadline, and stopping every server; it returns the record, or raises
`RunInterrupted` (carrying the record it wrote) when a signal or the deadline stopped the run.

A dtype that fails (bad flag, OOM, server killed or hung mid-run) is recorded as that dtype's failure with
its log tail, and the run goes on with the next one. Nothing measured is dropped.

This module orchestrates (the dtypes in order, the deadline and signals, the record's writes, what is derived
when the run ends); one dtype's phases are harness/run/phases.py and harness/run/loadphase.py over the shared state of
harness/run/runcontext.py, its capacity checks harness/server/capacitychecks.py, the findings
kvbench/records/findings.py.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path

from kvbench import records
from kvbench.core import kvscales
from kvbench.core.errors import KvbenchError
from kvbench.core.errors import one_line as _one_line
from kvbench.harness.client.metrics import DEFINITIONS
from kvbench.harness.quality import underload as quality
from kvbench.harness.run import phases, spill
from kvbench.harness.run.comparisons import comparisons
from kvbench.harness.run.notices import notices
from kvbench.harness.run.runcontext import DtypeRun, RunState
from kvbench.harness.run.runfindings import findings
from kvbench.harness.run.runplan import Decide, Reporter, RunOptions, RunPlan
from kvbench.harness.server import energy, scales
from kvbench.harness.server.endpoint import served_vllm
from kvbench.harness.server.lifecycle import ServerConfig, VllmServer, stop_all
from kvbench.records import (
    DtypeResult,
    DtypeStatus,
    Finding,
    RunRecord,
    SampleStore,
    Stop,
    StopReason,
    layout,
)
from kvbench.records.findings import FindingKind
from kvbench.specs.machine import environment
from kvbench.specs.models import spec_for


class RunInterrupted(KvbenchError):
    """A signal or the deadline stopped the run; the record of what was measured is written (at `path`)."""

    exit_code = 130

    def __init__(self, record: RunRecord, path: Path):
        stop = record.stopped
        super().__init__(f"{stop.detail if stop else 'interrupted'}; partial record written to {path}")
        self.record, self.path = record, path
        self.reason = stop.reason if stop else StopReason.SIGNAL


class Runner:
    def __init__(
        self, plan: RunPlan, reporter: Reporter | None = None, extra: dict | None = None, decide: Decide | None = None
    ):
        self.plan = plan
        self.decide = decide  # the recommendation, handed in: the harness measures, kvbench.analysis.verdict judges
        self.reporter = reporter or Reporter()
        self.run_id = records.new_run_id(plan.machine)
        self.path = records.record_path(plan.results_dir, plan.machine, self.run_id)
        self.samples = SampleStore(self.run_id)
        rapl = energy.rapl_domains()  # CPU package energy counters, where the kernel exposes them
        evaluator = quality.Evaluator() if plan.eval_tasks else None
        self.spilled: str | None = None  # where the record went when the disk was full (the run then exits 1)
        self.record = RunRecord(
            run_id=self.run_id,
            created_at=records.utc_iso(),
            machine=plan.machine,
            config=plan.as_dict(),
            environment=environment(),
            definitions=dict(DEFINITIONS),
            model_provenance=plan.model_provenance,  # a real model's package, version, sha256 (kvbench/realmodels)
            **(extra or {}),
        )
        self._client_vllm = self.record.environment.get("vllm")
        # what every dtype's phases share; make_server looks `_server` up per dtype (tests replace it)
        self.state = RunState(
            plan,
            self.reporter,
            self.samples,
            self.record.environment,
            make_server=lambda dtype: self._server(dtype),
            rapl=rapl,
            evaluator=evaluator,
        )
        self._current: DtypeRun | None = None  # the dtype being measured

    def flush(self) -> Path:
        if self.plan.endpoints:  # what was measured is the servers' vLLM, not this machine's
            versions = [d.server.vllm_version for d in self.record.dtypes if d.server]
            self.record.environment["vllm"] = served_vllm(self._client_vllm, versions)
        spilled = spill.flush(self.path, self.record, self.samples)  # a full disk never loses the record
        if spilled:
            self.spilled = spilled
            self.reporter.note(spilled)
        return self.path

    async def run(self, deadline_s: float | None = None, deadline_note: str | None = None) -> RunRecord:
        stop: Stop | None = None
        try:
            async with asyncio.timeout(deadline_s):
                await self._all_dtypes()
        except TimeoutError:
            stop = Stop(
                reason=StopReason.DEADLINE,
                detail=deadline_note or f"stopped: the deadline of {deadline_s:.0f} s passed",
            )
        except (KeyboardInterrupt, asyncio.CancelledError):
            stop = Stop(reason=StopReason.SIGNAL, detail="interrupted (Ctrl-C, SIGTERM or SIGHUP)")
            raise
        finally:
            self._finish(stop)
        return self.record

    async def _all_dtypes(self) -> None:
        # The 16-bit baseline runs first, so every quantized dtype can be compared with its outputs.
        order = sorted(self.plan.kv_dtypes, key=lambda d: d != "auto")
        for i, dtype in enumerate(order):
            self.reporter.dtype_started(dtype, i, len(order))
            result = DtypeResult(kv_cache_dtype=dtype)
            self.record.dtypes.append(result)
            if dtype in self.plan.unsupported:
                result.status, result.error = DtypeStatus.UNSUPPORTED, self.plan.unsupported[dtype]
            else:
                if dtype in self.plan.emulated:
                    result.emulated, result.implementation = True, dict(self.plan.emulated[dtype])
                await self._one_dtype(dtype, result)
            self.flush()

    def _finish(self, stop: Stop | None) -> None:
        rec = self.record
        for d in rec.dtypes:
            if d.status == DtypeStatus.RUNNING:  # the one that was being measured when the run stopped
                d.status = DtypeStatus.PARTIAL if records.measured_anything(d) else DtypeStatus.FAILED
                d.error = stop.detail if stop else "stopped"
        rec.stopped = stop
        rec.status = records.derive_status([d.status for d in rec.dtypes], stop is not None)
        if self.state.evaluator is not None:
            self.state.evaluator.close()
        try:
            rec.findings = [*self.state.changed, *findings(rec, spec_for(self.plan.model)), *notices(rec)]
            rec.comparisons = comparisons(rec)
            evals = {d.kv_cache_dtype: d.eval for d in rec.dtypes if d.eval}
            quality.compare_conditions(evals, self.state.eval_items)
            for d in rec.dtypes:
                if d.kv_cache_dtype in evals:
                    d.eval = evals[d.kv_cache_dtype]
            if (
                self.decide is not None
            ):  # the one recommendation (kvbench.analysis.verdict.decide), from the typed record
                decision = self.decide(rec)
                rec.quality = decision.as_dict()
                rec.findings = [*rec.findings, *decision.findings()]
        except Exception as exc:  # what is derived must never cost what was measured
            error = Finding(level="error", kind=FindingKind.ERROR, text=f"findings not derived: {_one_line(exc)}")
            rec.findings = [*rec.findings, error]
        rec.finished_at = records.utc_iso()
        self.flush()

    # -- one dtype --------------------------------------------------------------------------------

    async def _one_dtype(self, dtype: str, result: DtypeResult) -> None:
        """Measure one dtype into `result` (harness/run/phases.py); its failure is recorded there, never raised."""
        self._current = DtypeRun(self.state, dtype, result)
        await phases.measure_dtype(self._current)

    @property
    def server(self) -> VllmServer | None:
        """The server of the dtype being measured (managed runs), for callers that watch it."""
        return self._current.server if self._current else None

    def _server(self, dtype: str) -> VllmServer:
        plan = self.plan
        model = scales.served_folder(plan, dtype, self.reporter)  # a --kv-scales variant serves its own copy
        cfg = ServerConfig(
            model=model,
            kv_cache_dtype=kvscales.base_dtype(dtype),
            max_model_len=plan.max_model_len,
            extra_args=plan.extra_args,
            env={"HF_HUB_OFFLINE": "1", **plan.server_env} if Path(model).exists() else plan.server_env,
            startup_timeout_s=plan.startup_timeout_s,
        )
        log = layout.logs_dir(plan.results_dir, plan.machine, self.run_id) / f"vllm-{dtype}.log"
        return VllmServer(cfg, log)


# -- the one entry point ------------------------------------------------------------------------------


def _sigterm(*_):  # SIGTERM takes the same clean path as Ctrl-C
    raise KeyboardInterrupt


def execute(
    plan: RunPlan, reporter: Reporter | None = None, options: RunOptions = RunOptions(), *, decide: Decide | None = None
) -> tuple[RunRecord, Path]:
    """Run a plan to its record: (record, path). Every server is stopped however it ends.

    decide(record): the recommendation the record carries (kvbench.analysis.verdict.decide;
    kvbench.orchestration.measure.execute hands it in); without it the record has no verdict. options: what the caller
    adds (RunOptions: record fields, a deadline, a finishing hook). Raises RunInterrupted after writing the partial
    record when a signal or the deadline stopped the run."""
    records.check_writable(plan.results_dir, plan.machine)
    spill.check_space(plan.results_dir)
    runner = Runner(plan, reporter, options.extra, decide)
    main = threading.current_thread() is threading.main_thread()
    # SIGTERM and SIGHUP (a closed terminal or ssh session) take Ctrl-C's path: the partial record is kept
    previous = {s: signal.signal(s, _sigterm) for s in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    try:
        try:
            asyncio.run(runner.run(options.deadline_s, options.deadline_note))
        except KeyboardInterrupt:
            if runner.record.stopped is None:  # before the runner could mark it (e.g. while the loop started)
                runner._finish(Stop(reason=StopReason.SIGNAL, detail="interrupted (Ctrl-C, SIGTERM or SIGHUP)"))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_all()
    if options.on_finish is not None:
        options.on_finish(runner.record)
        runner.flush()
    if runner.record.stopped is not None:
        raise RunInterrupted(runner.record, runner.path)
    if runner.spilled:
        raise spill.DiskFull(runner.record, runner.path, runner.spilled)
    return runner.record, runner.path
