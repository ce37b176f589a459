"""One night on one machine: the asv history point, the matrix through the harness, the regression gate,
the dashboard, and a summary that says why it failed when it did.

The history point, the gate and the dashboard are other kvbench commands (`kvbench history run`,
`kvbench regress --json`, `kvbench dashboard`), run as subprocesses through their documented CLI: their
output goes to results/<machine>/logs/nightly-<id>/ (never committed) and a failure shows its tail. The
matrix runs in this process through kvbench.orchestration.measure.execute (the harness, then the verdict), one entry at
a time; a dtype that fails is recorded by the harness and the run goes on, and an entry that fails does not stop
the next one.

Budget: the machine's max_minutes is a deadline. No entry starts after it; an entry still running at it
is stopped (its record is kept, marked interrupted) and every later entry is recorded as skipped. The
gate and the dashboard still run: they are what tells you what happened.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rich.markup import escape

from kvbench.core.errors import KvbenchError, UsageError
from kvbench.orchestration.nightly.config import NightlyConfig
from kvbench.orchestration.nightly.estimate import MachineEstimate
from kvbench.orchestration.nightly.matrix import Entry, MachinePlan, served_model
from kvbench.orchestration.nightly.outcomes import EntryResult, EntryStatus, NightStatus, StepResult, StepStatus
from kvbench.orchestration.nightly.stepio import _fmt_change, _json_after_command, _last_line, _stop_group
from kvbench.orchestration.nightly.target import Target, detect, results_dir_of
from kvbench.records import DtypeStatus, layout, linked_records, load_record

# Target, detect, results_dir_of and the statuses stay importable from here, where callers found them.
__all__ = [
    "EntryResult",
    "EntryStatus",
    "NightStatus",
    "Nightly",
    "StepResult",
    "StepStatus",
    "Target",
    "detect",
    "results_dir_of",
]


SCHEMA = "kvbench.orchestration.nightly/1"
NIGHTLY_DIR = "nightly"  # results/<machine>/nightly/<id>.json: one summary per night


# -- the night ----------------------------------------------------------------------------------------


class Nightly:
    def __init__(
        self,
        cfg: NightlyConfig,
        cfg_path: Path,
        plan: MachinePlan,
        target: Target,
        estimate: MachineEstimate,
        asv_conf: Path,
        site_out: Path,
        console,
        vllm_installed: tuple[str | None, str | None],
        night_id: str | None = None,
    ):
        from kvbench.records import utc_iso

        self.cfg, self.cfg_path, self.plan, self.target, self.estimate = cfg, cfg_path, plan, target, estimate
        self.asv_conf = Path(asv_conf).absolute()
        needs_asv = cfg.history.enabled or cfg.gate.enabled
        # without history and gate, a checkout's asv config is optional: results/ beside the working directory
        self.results_dir = (
            results_dir_of(self.asv_conf) if needs_asv or self.asv_conf.exists() else Path("results").absolute()
        )
        self.site_out = Path(site_out)
        self.console = console
        self.started_at = utc_iso()
        # a fleet's shards share one id (kvbench.orchestration.nightly.shards), so their logs and the merged summary
        # line up
        self.id = night_id or f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{target.machine}"
        self.summary_path = self.results_dir / target.machine / NIGHTLY_DIR / f"{self.id}.json"
        self.nodes: list[
            dict
        ] = []  # a multi-node night's nodes (kvbench.orchestration.nightly.nodes), named in every record
        self.logs = layout.logs_dir(self.results_dir, target.machine, f"nightly-{self.id}")
        self.t0 = time.monotonic()
        self.deadline = self.t0 + plan.cfg.max_minutes * 60
        self.steps: dict[str, StepResult] = {}
        self.entries: list[EntryResult] = []
        self.vllm_installed = vllm_installed
        self.interrupted = False

    # -- helpers ------------------------------------------------------------------------------------

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()

    def _kvbench(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "kvbench", *args]

    def _subprocess(
        self, name: str, argv: list[str], what: str, deadline: float | None
    ) -> tuple[int | None, float, Path]:
        """Run a kvbench command with its output in the night's log folder; (rc or None if stopped, s, log)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        env = {**os.environ, "COLUMNS": "160", "KVBENCH_MACHINE": self.target.machine}
        t0 = time.monotonic()
        with open(log, "w") as fh:
            fh.write("$ " + " ".join(argv) + "\n")
            fh.flush()
            # its own process group: a stop reaches asv, the benchmark processes and their vLLM servers
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env)
            try:
                with self.console.status(f"{what} (log: {log})") as status:
                    while True:
                        try:
                            rc = proc.wait(timeout=1.0)
                            return rc, time.monotonic() - t0, log
                        except subprocess.TimeoutExpired:
                            pass
                        status.update(f"{what}: {(time.monotonic() - t0) / 60:.1f} min (log: {log})")
                        if deadline is not None and time.monotonic() > deadline:
                            _stop_group(proc)
                            return None, time.monotonic() - t0, log
            except BaseException:
                _stop_group(proc)
                raise

    def _tail(self, log: Path, n: int = 15) -> str:
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    # -- steps --------------------------------------------------------------------------------------

    def history(self) -> StepResult:
        if not self.cfg.history.enabled:
            return StepResult("history", StepStatus.SKIPPED, "disabled in [history]")
        if self.remaining_s() <= 0:
            return StepResult("history", StepStatus.SKIPPED, f"budget of {self.plan.cfg.max_minutes:g} min spent")
        args = self._history_args()
        from kvbench.records import utc_iso

        started = utc_iso()
        rc, secs, log = self._subprocess(
            "history", self._kvbench(*args), "asv history point (kvbench history run)", self.deadline
        )
        if rc is None:
            return StepResult(
                "history",
                StepStatus.FAILED,
                f"stopped: the budget of {self.plan.cfg.max_minutes:g} min ran out",
                secs,
                str(log),
            )
        if rc != 0:
            tail = self._tail(log, 8)
            return StepResult(
                "history",
                StepStatus.FAILED,
                f"kvbench history run exited {rc}: {_last_line(tail)}",
                secs,
                str(log),
                {"tail": tail},
            )
        return self._judge_history(self._history_record(started), secs, log)

    def _history_args(self) -> list[str]:
        """`kvbench history run`'s arguments: this machine, the asv config, the served history model, the benches."""
        args = [
            "history",
            "run",
            "--venv",
            sys.prefix,
            "--machine",
            self.target.machine,
            "--asv-config",
            str(self.asv_conf),
        ]
        model, _ = served_model(self.plan.history_model, self.plan.on_gpu)
        if model is not None:
            args += ["--model", model]
        for regex in self.cfg.history.bench:
            args += ["--bench", regex]
        return args

    def _judge_history(self, record: Path | None, secs: float, log: Path) -> StepResult:
        """The history step's result from the run record its point wrote."""
        # asv calls a point whose dtype failed a success (the metric is n/a); the night does not
        if record is None:
            return StepResult(
                "history", StepStatus.OK, "history point added (its run record was not found)", secs, str(log)
            )
        try:
            doc = load_record(record)
        except UsageError as exc:
            return StepResult(
                "history",
                StepStatus.FAILED,
                f"history point added, but its run record is unreadable: {exc}",
                secs,
                str(log),
            )
        dtypes = {d["kv_cache_dtype"]: d["status"] for d in doc.get("dtypes", [])}
        errors = {
            d["kv_cache_dtype"]: _last_line(str(d.get("error") or d["status"]))
            for d in doc.get("dtypes", [])
            if d["status"] != DtypeStatus.OK
        }
        expected = {d: self.plan.cfg.expected_failures[d] for d in errors if d in self.plan.cfg.expected_failures}
        data = {"record": str(record), "dtypes": dtypes, "errors": errors, "expected": expected}
        bad = {d: e for d, e in errors.items() if d not in expected}
        if bad:
            why = "; ".join(f"{d} {dtypes[d]}: {e}" for d, e in bad.items())
            return StepResult(
                "history", StepStatus.FAILED, f"history point added, but its run failed for {why}", secs, str(log), data
            )
        return StepResult(
            "history",
            StepStatus.OK,
            "history point added" + (f" ({', '.join(expected)} failed as expected)" if expected else ""),
            secs,
            str(log),
            data,
        )

    def _history_record(self, since: str) -> Path | None:
        """The run record the history point's serving benchmark wrote: the newest one with an asv link since `since`."""
        found = [
            path for created, _, path in linked_records(self.results_dir / self.target.machine) if created >= since
        ]
        return found[-1] if found else None

    def matrix(self, progress_factory) -> None:
        from kvbench.harness.run.progress import ProgressReporter
        from kvbench.harness.run.runner import RunInterrupted
        from kvbench.harness.run.runplan import RunOptions
        from kvbench.orchestration.measure import execute
        from kvbench.orchestration.nightly.matrix import run_plan
        from kvbench.records import StopReason

        estimates = {e.name: e.total_s for e in self.estimate.entries}
        for i, entry in enumerate(self.plan.entries):
            result = EntryResult(entry.name, EntryStatus.RUNNING, estimates.get(entry.name, 0.0))
            self.entries.append(result)
            if self.remaining_s() <= 0:
                result.status = EntryStatus.SKIPPED
                result.error = f"budget of {self.plan.cfg.max_minutes:g} min spent before it started"
                continue
            self.console.print(
                f"[bold]entry {i + 1}/{len(self.plan.entries)}: {escape(entry.name)}[/] "
                f"(estimate {result.estimate_s / 60:.1f} min, {self.remaining_s() / 60:.1f} min of budget left)"
            )
            t0 = time.monotonic()
            try:
                price = self.estimate.price_per_hour
                prices = {self.plan.key: price} if price is not None and self.plan.on_gpu else None
                rp = run_plan(entry, self.plan.on_gpu, self.results_dir, self.target.machine, prices)
            except KvbenchError as exc:
                result.status, result.error = EntryStatus.FAILED, str(exc)
                continue
            except Exception as exc:  # e.g. a tokenizer that will not load: this entry fails, the night goes on
                result.status, result.error = EntryStatus.FAILED, f"{type(exc).__name__}: {exc}"
                continue
            extra = {
                "nightly": {
                    "id": self.id,
                    "entry": entry.name,
                    "section": self.plan.key,
                    "config": str(self.cfg_path),
                    "vllm_wanted": self.plan.vllm,
                    **({"nodes": self.nodes} if self.nodes else {}),
                }
            }
            budget = f"stopped: the nightly budget of {self.plan.cfg.max_minutes:g} min ran out"
            record = None
            try:
                with progress_factory() as progress:
                    record, path = execute(
                        rp,
                        ProgressReporter(progress),
                        RunOptions(extra=extra, deadline_s=max(0.0, self.remaining_s()), deadline_note=budget),
                    )
                result.record = str(path)
            except RunInterrupted as exc:
                record, result.record = exc.record, str(exc.path)
                result.status, result.error = EntryStatus.INTERRUPTED, exc.record.stopped.detail
                if exc.reason == StopReason.SIGNAL:
                    self.interrupted = True
                    raise KeyboardInterrupt from None
            except Exception as exc:  # a harness bug must not cost the rest of the night
                result.status, result.error = EntryStatus.FAILED, f"{type(exc).__name__}: {exc}"
            finally:
                result.seconds = time.monotonic() - t0
            if record is not None:
                self._classify(result, record.as_doc(), entry)

    def _classify(self, result: EntryResult, doc: dict, entry: Entry) -> None:
        expected = self.plan.cfg.expected_failures
        for d in doc.get("dtypes", []):
            dtype, status = d["kv_cache_dtype"], d["status"]
            result.dtypes[dtype] = status
            if status != DtypeStatus.OK:
                result.errors[dtype] = _last_line(str(d.get("error") or status))
                if dtype in expected:
                    result.expected[dtype] = expected[dtype]
        if entry.atlas:  # every dtype vLLM offers: one it refuses, or that loses accuracy, is what the atlas shows
            for dtype, status in result.dtypes.items():
                if status == DtypeStatus.UNSUPPORTED:
                    result.expected.setdefault(dtype, "the atlas records what vLLM refuses")
        for dtype, g in ((doc.get("quality") or {}).get("gate") or {}).items():
            # a dtype shown worse than the budget allows (kvbench.analysis.verdict: inferior accuracy, canaries) fails
            # the night, as a regression does; one merely not shown good enough (undecided, no eval) does not
            if g.get("breach") and dtype not in expected and not entry.atlas:
                result.errors[dtype] = f"quality gate: {g['reason']}"
                result.quality_breach = True
        if result.status != EntryStatus.RUNNING:
            return
        unexpected = [
            d
            for d, s in result.dtypes.items()
            if (s != DtypeStatus.OK or d in result.errors) and d not in result.expected
        ]
        missing = [] if entry.atlas else [d for d in entry.kv_dtypes if d not in result.dtypes]
        result.status = EntryStatus.FAILED if unexpected or missing else EntryStatus.OK
        if missing:
            result.error = f"no result for {', '.join(missing)}"

    def gate(self) -> StepResult:
        if not self.cfg.gate.enabled:
            return StepResult("gate", StepStatus.SKIPPED, "disabled in [gate]")
        args = [
            "regress",
            "--machine",
            self.target.machine,
            "--results",
            str(self.results_dir),
            "--asv-config",
            str(self.asv_conf),
            "--json",
        ]
        if self.cfg.gate.window is not None:
            args += ["--window", str(self.cfg.gate.window)]
        if self.cfg.gate.threshold_pct is not None:
            args += ["--threshold", str(self.cfg.gate.threshold_pct)]
        rc, secs, log = self._subprocess("regress", self._kvbench(*args), "regression gate (kvbench regress)", None)
        text = log.read_text(errors="replace")
        report = _json_after_command(text)
        if rc in (0, 1) and report is not None:
            bad = [s for s in report.get("series", []) if s.get("verdict") == "regression"]
            verdicts = [s.get("verdict") for s in report.get("series", [])]
            counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts) if v != "regression"}
            detail = f"{len(bad)} regression(s) in {len(verdicts)} series" + "".join(
                f", {n} {v}" for v, n in counts.items()
            )
            return StepResult(
                "gate",
                StepStatus.REGRESSION if bad else StepStatus.OK,
                detail,
                secs,
                str(log),
                {"regressions": bad, "window": report.get("window"), "threshold_pct": report.get("threshold_pct")},
            )
        return StepResult(
            "gate", StepStatus.NOT_RUN, f"kvbench regress exited {rc}: {_last_line(self._tail(log, 5))}", secs, str(log)
        )

    def dashboard(self) -> StepResult:
        if not self.cfg.dashboard.enabled:
            return StepResult("dashboard", StepStatus.SKIPPED, "disabled in [dashboard]")
        args = ["dashboard", "--results", str(self.results_dir), "--out", str(self.site_out)]
        if self.asv_conf.exists():
            args += ["--asv-conf", str(self.asv_conf)]
        rc, secs, log = self._subprocess("dashboard", self._kvbench(*args), "dashboard (kvbench dashboard)", None)
        if rc != 0:
            return StepResult(
                "dashboard",
                StepStatus.FAILED,
                f"kvbench dashboard exited {rc}: {_last_line(self._tail(log, 5))}",
                secs,
                str(log),
            )
        index = self.site_out / "index.html"
        return StepResult(
            "dashboard", StepStatus.OK, f"{index}" if index.exists() else f"written to {self.site_out}", secs, str(log)
        )

    # -- the whole night ----------------------------------------------------------------------------

    def run(self, progress_factory) -> dict:
        # The machine reaches each run as its plan's field (run_plan) and each kvbench step as KVBENCH_MACHINE
        # in that subprocess's environment (_subprocess); this process's environment stays as it was.
        try:
            self.steps["history"] = self.history()
            self.console.print(escape(f"history: {self.steps['history'].status} ({self.steps['history'].detail})"))
            self.matrix(progress_factory)
        except KeyboardInterrupt:
            self.interrupted = True
        for entry in self.plan.entries[len(self.entries) :]:  # never started (Ctrl-C)
            self.entries.append(
                EntryResult(entry.name, EntryStatus.SKIPPED, 0.0, error="not started: the night was interrupted")
            )
        if not self.interrupted:
            self.steps["gate"] = self.gate()
            self.steps["dashboard"] = self.dashboard()
        return self.write_summary()

    def reasons(self) -> list[str]:
        out = []
        if self.interrupted:
            out.append("interrupted (Ctrl-C or SIGTERM)")
        for e in self.entries:
            if e.status == EntryStatus.SKIPPED:
                out.append(f"{e.name}: skipped ({e.error})")
            elif e.status != EntryStatus.OK:
                bad = {d: msg for d, msg in e.errors.items() if d not in e.expected}
                why = "; ".join(f"{d} {e.dtypes.get(d, '?')}: {msg}" for d, msg in bad.items()) or e.error or e.status
                out.append(f"{e.name}: {e.status} ({why})")
        for s in self.steps.values():
            if s.status == StepStatus.REGRESSION:
                for r in s.data.get("regressions", []):
                    out.append(
                        f"regression: {r.get('label') or r.get('metric')} [{r.get('kv_dtype')}] {_fmt_change(r)}"
                    )
            elif s.status in (StepStatus.FAILED, StepStatus.NOT_RUN) and not (
                s.name == "gate"
                and self.steps.get("history", StepResult("", StepStatus.SKIPPED)).status == StepStatus.FAILED
            ):
                out.append(f"{s.name}: {s.status} ({s.detail})")
        return out

    def minutes(self) -> float:
        return (time.monotonic() - self.t0) / 60

    def write_summary(self) -> dict:
        from kvbench.records import write_atomic

        doc = self.summary_doc()
        self.path = write_atomic(self.summary_path, doc)
        return doc

    def summary_doc(self) -> dict:
        from kvbench.records import utc_iso

        reasons = self.reasons()
        regressed = any(s.status == StepStatus.REGRESSION for s in self.steps.values())
        failed = [r for r in reasons if not r.startswith("regression:")]
        status = (
            NightStatus.OK
            if not reasons
            else (NightStatus.REGRESSION if regressed and not failed else NightStatus.FAILED)
        )
        doc = {
            "schema": SCHEMA,
            "id": self.id,
            "machine": self.target.machine,
            "section": self.plan.key,
            "gpu": self.target.gpu_name,
            "config": str(self.cfg_path),
            "vllm": {"wanted": self.plan.vllm, "package": self.vllm_installed[0], "version": self.vllm_installed[1]},
            "started_at": self.started_at,
            "finished_at": utc_iso(),
            "minutes": self.minutes(),
            "budget_minutes": self.plan.cfg.max_minutes,
            "estimate_minutes": self.estimate.minutes,
            "status": status,
            "reasons": reasons,
            "steps": {k: asdict(v) for k, v in self.steps.items()},
            "entries": [asdict(e) for e in self.entries],
            "site": str(self.site_out),
        }
        return doc
