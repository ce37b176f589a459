"""Everything the pages show, read once from a results folder into pandas frames.

Pages only read a `SiteData`; nothing here runs a benchmark. A file that cannot be read is skipped and
named in `problems`, so one bad record never hides the rest (the overview page lists them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pandas as pd

from kvbench import records as run_records
from kvbench.errors import KvbenchError
from kvbench.history import SHAPE as HISTORY_COLUMNS
from kvbench.records import PhaseKind, conditions, workload_label
from kvbench.records.findings import FindingKind

REGRESSION_COLUMNS = [
    "machine",
    "metric",
    "kv_dtype",
    "newest",
    "baseline",
    "change_pct",
    "spread",
    "direction",
    "commit",
    "run_id",
    "verdict",
]
REGRESSION = "regression"  # kvbench.regress's verdict for a change past the allowed band in the bad direction


@dataclass
class SiteData:
    results_dir: Path
    records: list[dict] = field(default_factory=list)  # run records as read, each with "_path"
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per (run, dtype)
    probes: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per SLO-search phase
    fronts: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per point of a dtype's trade-off curve
    quality: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per (run, dtype, condition, task) accuracy
    canaries: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per (run, dtype): canaries sent / differed
    findings: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per run finding
    history: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=HISTORY_COLUMNS))
    regressions: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=REGRESSION_COLUMNS))
    history_note: str | None = None  # why history is empty or partial
    accuracy: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per (record, data, format, scale)
    kernel_records: list[dict] = field(default_factory=list)
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)  # decode and write rows of kernel records
    claims: dict | None = None  # the claims document
    verdicts: list = field(default_factory=list)  # kvbench.claims.Verdict
    problems: list[str] = field(default_factory=list)


# --- run records -------------------------------------------------------------------------------------

ACCURACY_FORMAT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@lru_cache(maxsize=64)
def model_spec(name: str | None, path: str | None):
    """The ModelSpec a run served (kvbench.models.spec_for: the run's own config first, then its name)."""
    from kvbench.models import spec_for
    from kvbench.tinyconfig import NAME

    return spec_for(name) if name == NAME else spec_for(path, name)  # the tiny model's shape is kvbench's own


def gpu_of(env: dict) -> str:
    """The accelerator a record ran on, in words: NVML's GPU name (with count), else the CPU model."""
    gpus = env.get("gpus") or []
    if gpus:
        names = sorted({g.get("name") or "?" for g in gpus})
        return ", ".join(f"{len(gpus)}x {n}" if len(gpus) > 1 else n for n in names)
    cpu = env.get("cpu") or {}
    return f"CPU: {cpu.get('model') or '?'}"


def _slo_met(slo: dict | None, summary: dict) -> tuple[bool | None, str]:
    """The SLO verdict for a phase summary, by the harness's own rule (kvbench.harness.slo.SLO)."""
    if not slo:
        return None, "no SLO in the run's config"
    from kvbench.harness.slo import SLO

    return SLO.from_dict(slo).check(summary)


def run_rows(doc: dict, path: Path | None) -> list[dict]:
    """summary_frame's rows plus what the pages need beside them: GPU, context, budget, SLO, workload."""
    env = doc.get("environment") or {}
    cfg = doc.get("config") or {}
    workload = cfg.get("workload") or {}
    slo = cfg.get("slo") or {}
    flagged = {  # by the finding's kind: a CPU-wait warning about a dtype says nothing about what it ran
        f.get("dtype"): f.get("text") for f in doc.get("findings") or [] if f.get("kind") == FindingKind.NOT_HONOURED
    }
    spec = model_spec(cfg.get("model_name"), cfg.get("model"))
    rows = []
    for base, d in zip(run_records.summary_rows(doc, path), doc.get("dtypes") or [], strict=False):
        cap = d.get("capacity") or {}
        model = cap.get("model") or {}
        measured = cap.get("measured") or {}
        engine = cap.get("engine") or {}
        rows.append(
            {
                **base,
                "gpu": gpu_of(env),
                "driver": env.get("driver"),
                "cuda": env.get("cuda_driver") or env.get("cuda_runtime"),
                "model_path": cfg.get("model"),
                "activation": ACCURACY_FORMAT.get(spec.activation_dtype) if spec else None,
                "context": model.get("context") or cfg.get("max_model_len") or engine.get("tokens_per_request"),
                "budget_bytes": model.get("budget_bytes"),
                "block_size": model.get("block_size"),
                "format": model.get("format"),
                "measured_capped": measured.get("capped"),
                "measured_cap": measured.get("cap"),
                "slo_ttft_p95_ms": slo.get("ttft_p95_ms"),
                "slo_tpot_p95_ms": slo.get("tpot_p95_ms"),
                "prompt_tokens": workload.get("prompt_tokens"),
                "workload": workload_label(cfg),
                "output_tokens": workload.get("output_tokens"),
                "fixed_load": _describe_load(
                    ((cfg.get("loads") or [{}])[0]) or {}
                ),  # the plan's, so a dtype that died first still groups
                "honoured": d.get("kv_cache_dtype") not in flagged,
                "finding": flagged.get(d.get("kv_cache_dtype")),
                "log_tail": "\n".join((d.get("log_tail") or [])[-8:]),
                **_ci_columns(d.get("fixed_stats") or {}),
                **_quality_columns(doc, d),
            }
        )
    return rows


def _quality_columns(doc: dict, d: dict) -> dict:
    """The run's quality gate for this dtype (harness/quality.py): eligible or not, and why."""
    g = ((doc.get("quality") or {}).get("gate") or {}).get(d.get("kv_cache_dtype")) or {}
    return {"quality_eligible": g.get("eligible"), "quality_reason": g.get("reason")}


CI_METRICS = ("ttft_p95_ms", "tpot_p95_ms", "output_throughput_tps", "goodput_rps", "request_throughput_rps")


def _ci_columns(stats: dict) -> dict:
    """`<metric>_ci_low/_ci_high/_n` for the headline metrics that were repeated (for error bars)."""
    out = {}
    for m in CI_METRICS:
        st = stats.get(m) or {}
        out.update({f"{m}_ci_low": st.get("ci_low"), f"{m}_ci_high": st.get("ci_high"), f"{m}_n": st.get("n")})
    return out


def quality_rows(doc: dict, path: Path | None) -> list[dict]:
    """Task accuracy per dtype, condition (rest / load / during_load) and task, from a run's evaluation."""
    env = doc.get("environment") or {}
    rows = []
    for d in doc.get("dtypes") or []:
        for cond, summary in conditions(d.get("eval")):
            for task, e in (summary.get("tasks") or {}).items():
                ci = e.get("ci95") or [None, None]
                vs = e.get("vs_auto") or {}
                rows.append(
                    {
                        "run_id": doc.get("run_id"),
                        "created_at": doc.get("created_at"),
                        "machine": doc.get("machine"),
                        "gpu": gpu_of(env),
                        "vllm_version": (env.get("vllm") or {}).get("version"),
                        "model": (doc.get("config") or {}).get("model_name"),
                        "kv_cache_dtype": d.get("kv_cache_dtype"),
                        "condition": cond,
                        "concurrency": summary.get("concurrency"),
                        "task": task,
                        "accuracy": e.get("accuracy"),
                        "ci_low": ci[0],
                        "ci_high": ci[1],
                        "n": e.get("n"),
                        "vs_auto": vs.get("verdict"),
                        "vs_rest": (e.get("vs_rest") or {}).get("verdict"),
                        "path": str(path) if path else None,
                    }
                )
    return rows


def canary_rows(doc: dict) -> list[dict]:
    rows = []
    for d in doc.get("dtypes") or []:
        sent = sum((p.get("canaries") or {}).get("sent", 0) for p in d.get("phases") or [])
        if sent:
            rows.append(
                {
                    "run_id": doc.get("run_id"),
                    "created_at": doc.get("created_at"),
                    "machine": doc.get("machine"),
                    "kv_cache_dtype": d.get("kv_cache_dtype"),
                    "sent": sent,
                    "differ": sum((p.get("canaries") or {}).get("differ", 0) for p in d.get("phases") or []),
                    "phases": sum(1 for p in d.get("phases") or [] if p.get("canaries")),
                }
            )
    return rows


def differing_items(path: str | None, dtype: str, task: str, condition: str, limit: int = 5) -> pd.DataFrame:
    """Items auto answered right and `dtype` wrong in the same condition, side by side (from the run's evals
    Parquet; empty when the samples are not on this disk)."""
    if not path:
        return pd.DataFrame()
    try:
        items = run_records.samples_frame([Path(path)], "evals")
    except Exception as exc:  # a damaged Parquet: the page says so instead of dropping the table silently
        out = pd.DataFrame()
        out.attrs["problem"] = f"{path}: its evals Parquet is unreadable ({type(exc).__name__}); items not shown"
        return out
    if items.empty:
        return items
    sel = items[(items["task"] == task) & (items["condition"] == condition)]
    ref = sel[sel["kv_cache_dtype"] == "auto"].set_index("doc_id")
    mine = sel[sel["kv_cache_dtype"] == dtype].set_index("doc_id")
    shared = ref.index.intersection(mine.index)
    both = ref.loc[shared].join(mine.loc[shared], lsuffix="_auto", rsuffix="_dtype")
    return both[(both["score_auto"] >= 1) & (both["score_dtype"] < 1)].head(limit).reset_index()


def front_rows(doc: dict) -> list[dict]:
    """Every point of every dtype's trade-off curve, with what the pages group and hover by."""
    env = doc.get("environment") or {}
    cfg = doc.get("config") or {}
    workload = cfg.get("workload") or {}
    rows = []
    for d in doc.get("dtypes") or []:
        f = d.get("front") or {}
        for p in f.get("points") or []:
            rows.append(
                {
                    **p,
                    "run_id": doc.get("run_id"),
                    "created_at": doc.get("created_at"),
                    "machine": doc.get("machine"),
                    "vllm_version": ((env.get("vllm") or {}).get("version")),
                    "gpu": gpu_of(env),
                    "kv_cache_dtype": d.get("kv_cache_dtype"),
                    "emulated": bool(d.get("emulated")),
                    "model": cfg.get("model_name") or cfg.get("model"),
                    "prompt_tokens": workload.get("prompt_tokens"),
                    "workload": workload_label(cfg),
                    "output_tokens": workload.get("output_tokens"),
                    "gpus": f.get("gpus"),
                    "price_per_gpu_hour": f.get("price_per_gpu_hour"),
                    "price_key": f.get("price_key"),
                    "energy_j_per_output_token": None,
                }
            )
        by_phase = {ph.get("name"): (ph.get("energy") or {}) for ph in d.get("phases") or []}
        for row in rows[len(rows) - len(f.get("points") or []) :]:
            e = by_phase.get(row["phase"]) or {}
            if e.get("valid"):
                row["energy_j_per_output_token"] = e.get("j_per_output_token")
    return rows


def _describe_load(mode: dict) -> str | None:
    if not mode:
        return None
    if mode.get("kind") == "concurrency" or "concurrency" in mode and "rate_rps" not in mode:
        return f"concurrency {mode.get('concurrency')}"
    return f"{mode.get('rate_rps')} req/s"


def probe_rows(doc: dict) -> list[dict]:
    """One row per SLO-search phase (`slo-c<N>`) and fixed closed-loop phase: P95s at concurrency N and
    whether they met the SLO.

    Read from the phases rather than capacity.measured.probes, so a dtype whose engine died mid-search
    still shows the probes it finished."""
    env = doc.get("environment") or {}
    vllm = env.get("vllm") or {}
    slo = (doc.get("config") or {}).get("slo")
    rows = []
    for d in doc.get("dtypes") or []:
        measured = (d.get("capacity") or {}).get("measured") or {}
        for i, phase in enumerate(d.get("phases") or []):
            name = phase.get("name") or ""
            search = phase.get("kind") == PhaseKind.SLO_PROBE
            concurrency, rate = phase.get("concurrency"), phase.get("rate_rps")
            # a fixed closed-loop load is one more point on the search's curve; an open-loop one a point on the
            # latency-vs-rate curve
            if concurrency is None and (search or rate is None):
                continue
            s = phase.get("summary") or {}
            met, why = _slo_met(slo, s)
            rows.append(
                {
                    "run_id": doc.get("run_id"),
                    "created_at": doc.get("created_at"),
                    "machine": doc.get("machine"),
                    "vllm_version": vllm.get("version"),
                    "kv_cache_dtype": d.get("kv_cache_dtype"),
                    "emulated": bool(d.get("emulated")),
                    "dtype_status": d.get("status"),
                    "order": i,
                    "phase": name,
                    "search": search,
                    "concurrency": concurrency,
                    "rate_rps": rate,
                    "ttft_p50_ms": (s.get("ttft_ms") or {}).get("p50"),
                    "ttft_p95_ms": (s.get("ttft_ms") or {}).get("p95"),
                    "tpot_p50_ms": (s.get("tpot_ms") or {}).get("p50"),
                    "tpot_p95_ms": (s.get("tpot_ms") or {}).get("p95"),
                    "completed": s.get("completed"),
                    "failed": s.get("failed"),
                    "met": met,
                    "why": why,
                    "knee": measured.get("max_concurrency"),
                }
            )
    return rows


def load_runs(results_dir: Path, data: SiteData) -> None:
    try:
        paths = run_records.find_records(results_dir)
    except KvbenchError as exc:
        data.problems.append(str(exc))
        paths = []
    rows, probes, findings, fronts, quality, canaries = [], [], [], [], [], []
    for path in paths:
        try:
            doc = run_records.load_record(path)
            doc_rows = run_rows(doc, path)
        except (KvbenchError, AttributeError, TypeError, ValueError) as exc:
            text = str(exc)  # a record's own error names its path already: never "X: skipped (X: ...)"
            data.problems.append(run_records.note_skipped(text if text.startswith(str(path)) else f"{path}: {text}"))
            continue
        doc["_path"] = str(path)
        data.records.append(doc)
        rows += doc_rows
        probes += probe_rows(doc)
        fronts += front_rows(doc)
        quality += quality_rows(doc, path)
        canaries += canary_rows(doc)
        for f in doc.get("findings") or []:
            findings.append(
                {
                    "run_id": doc.get("run_id"),
                    "machine": doc.get("machine"),
                    "created_at": doc.get("created_at"),
                    "kv_cache_dtype": f.get("dtype"),
                    "level": f.get("level"),
                    "kind": f.get("kind"),
                    "text": f.get("text"),
                }
            )
    data.runs = _dated(pd.DataFrame(rows), ["created_at", "kv_cache_dtype"])
    data.probes = _dated(pd.DataFrame(probes), ["created_at", "kv_cache_dtype", "order"])
    data.findings = _dated(pd.DataFrame(findings), ["created_at"])
    data.fronts = _dated(pd.DataFrame(fronts), ["created_at", "kv_cache_dtype", "concurrency"])
    data.quality = _dated(pd.DataFrame(quality), ["created_at", "kv_cache_dtype"])
    data.canaries = _dated(pd.DataFrame(canaries), ["created_at", "kv_cache_dtype"])
    data.records.sort(key=lambda d: str(d.get("created_at")))


def _dated(frame: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    if frame.empty:
        return frame
    frame["created_at"] = pd.to_datetime(frame["created_at"], utc=True, errors="coerce")
    return frame.sort_values(order, kind="stable").reset_index(drop=True)


def setup_label(row) -> str:
    """What a run measured, apart from the machine: model, request shape and fixed load (a nightly runs
    several of these per machine, and each needs its own newest run)."""

    def part(key):
        value = row.get(key)
        return "?" if value is None or value != value else value

    workload = row.get("workload")
    if workload is None or workload != workload:  # rows from before workloads: the fixed lengths
        workload = f"fixed {part('prompt_tokens')}+{part('output_tokens')} tokens"
    return f"{part('model')}, {workload}, {part('fixed_load')}"


def latest_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The newest run's row per (machine, setup, dtype), with the `setup` label as a column."""
    if runs.empty:
        return runs
    runs = runs.assign(setup=[setup_label(r) for _, r in runs.iterrows()])
    return (
        runs.sort_values("created_at", kind="stable")
        .groupby(["machine", "setup", "kv_cache_dtype"], sort=False)
        .tail(1)
    )


def setups(latest: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(machine, setup, title) per newest-run group; the title names the setup only where a machine has several."""
    pairs = sorted(
        {(m, s) for m, s in zip(latest["machine"], latest["setup"], strict=False)}, key=lambda p: (str(p[0]), str(p[1]))
    )
    per_machine = {m: sum(1 for mm, _ in pairs if mm == m) for m, _ in pairs}
    return [(m, s, f"{m} — {s}" if per_machine[m] > 1 else str(m)) for m, s in pairs]


def newest_record_per_machine(records: list[dict]) -> list[dict]:
    newest: dict[str, dict] = {}
    for doc in records:  # sorted by created_at
        newest[doc.get("machine")] = doc
    return [newest[k] for k in sorted(newest, key=str)]


# --- history and regressions (kvbench.history / kvbench.regress) -----------------------------------------


def load_history(results_dir: Path, asv_conf: Path | None, data: SiteData) -> None:
    from kvbench import history

    if not (Path(results_dir) / "benchmarks.json").is_file():
        data.history_note = "no asv results: benchmarks.json is missing"
        return
    conf = asv_conf if asv_conf is not None else _asv_conf_for(results_dir)
    try:
        problems: list[str] = []
        frame = history.history_frame(results_dir=str(results_dir), asv_conf=str(conf), problems=problems)
        data.problems += [p for p in problems if p not in data.problems]
    except Exception as exc:  # asv raises its own UserError types; the page says what went wrong
        data.history_note = f"history not read: {' '.join(str(exc).split())}"
        data.problems.append(data.history_note)
        return
    if frame is None or frame.empty:
        return
    frame = frame.copy()
    for col in ("commit_date", "run_started"):
        if col in frame:
            frame[col] = pd.to_datetime(frame[col], utc=True, errors="coerce")
    # One vLLM release after another can run on the same kvbench commit: a point's time is when it ran.
    frame["when"] = (
        frame["run_started"].fillna(frame["commit_date"]) if "run_started" in frame else frame["commit_date"]
    )
    data.history = frame.sort_values(["machine", "metric", "kv_dtype", "when"], kind="stable").reset_index(drop=True)
    from kvbench import regress

    try:
        found = regress.find_regressions(data.history)  # `kvbench regress`'s own defaults
    except Exception as exc:  # a broken rule must not take the other pages down; the overview lists it
        data.problems.append(f"regressions not computed: {exc}")
        return
    rows = [r if isinstance(r, dict) else _as_dict(r) for r in found]
    data.regressions = pd.DataFrame(rows).reindex(
        columns=list(dict.fromkeys([*REGRESSION_COLUMNS, *(rows[0] if rows else [])]))
    )


def _as_dict(obj) -> dict:
    from dataclasses import asdict, is_dataclass

    return asdict(obj) if is_dataclass(obj) else dict(vars(obj))


def _asv_conf_for(results_dir: Path) -> Path:
    """asv.conf.json beside the results folder (a repo checkout), else the one in the working directory."""
    beside = Path(results_dir).resolve().parent / "asv.conf.json"
    return beside if beside.is_file() else Path("asv.conf.json")


# --- kernel and accuracy records ------------------------------------------------------------------------


def _json_records(results_dir: Path, kind: str, schema: str, data: SiteData) -> list[dict]:
    out = []
    if not Path(results_dir).is_dir():
        return out
    for path in sorted(Path(results_dir).glob(f"*/{kind}/*.json")):
        if path.name.startswith("."):
            continue  # a writer's temp file
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            data.problems.append(f"{path}: skipped ({exc})")
            continue
        if not isinstance(doc, dict) or doc.get("schema") != schema:
            data.problems.append(
                f"{path}: skipped (schema {doc.get('schema') if isinstance(doc, dict) else None!r}, expected {schema})"
            )
            continue
        doc["_path"] = str(path)
        out.append(doc)
    return sorted(out, key=lambda d: str(d.get("created_at")))


def load_accuracy(results_dir: Path, data: SiteData) -> None:
    rows = []
    for doc in _json_records(results_dir, "accuracy", "kvbench.accuracy/1", data):
        base = {
            "machine": doc.get("machine"),
            "created_at": doc.get("created_at"),
            "path": doc["_path"],
            "vllm_version": (doc.get("environment") or {}).get("vllm"),
        }
        real = doc.get("real") or {}
        sources = [
            ("synthetic", (doc.get("synthetic") or {}).get("rows")),
            ("real K/V", real.get("rows")),
            ("model output", real.get("model_output")),
        ]
        for kind, items in sources:
            for r in items or []:
                rows.append(
                    {
                        **base,
                        "kind": kind,
                        "data": r.get("data"),
                        "format": r.get("format"),
                        "scale": r.get("scale"),
                        "rel_l2": r.get("rel_l2"),
                        "cos_mean": r.get("cos_mean"),
                        "max_abs": r.get("max_abs"),
                        "model": real.get("model") if kind != "synthetic" else None,
                    }
                )
    data.accuracy = _dated(pd.DataFrame(rows), ["created_at"])


def load_kernels(results_dir: Path, data: SiteData) -> None:
    rows = []
    docs = _json_records(results_dir, "kernels", "kvbench.kernels/1", data)
    for doc in docs:
        cat = doc.get("gpu_catalog") or {}
        device = ((doc.get("environment") or {}).get("device") or {}).get("name")
        base = {
            "machine": doc.get("machine"),
            "created_at": doc.get("created_at"),
            "mode": doc.get("mode"),
            "device": device,
            "peak_gbs": cat.get("hbm_bandwidth_gbs"),
            "gpu_key": cat.get("key"),
            "copy_gbs": (doc.get("copy_baseline") or {}).get("gbs") if doc.get("mode") == "gpu" else None,
            "path": doc["_path"],
        }
        for kind in ("decode", "write"):
            for r in doc.get(kind) or []:
                rows.append(
                    {
                        **base,
                        "kernel": kind,
                        "format": r.get("format"),
                        "batch": r.get("batch"),
                        "context": r.get("context"),
                        "tokens": r.get("tokens"),
                        "time_us": r.get("time_us"),
                        "gbs": r.get("gbs"),
                        "pct_of_peak": r.get("pct_of_peak"),
                        "pct_of_copy": r.get("pct_of_copy"),
                    }
                )
    data.kernel_records = docs
    data.kernels = _dated(pd.DataFrame(rows), ["created_at"])


# --- claims ------------------------------------------------------------------------------------------------


def load_claims_data(data: SiteData, claims_file: Path | None = None) -> None:
    from kvbench.claims import evaluate, load_claims, measured_values

    try:
        doc = load_claims(claims_file)
    except KvbenchError as exc:
        data.problems.append(f"claims not read: {exc}")
        return
    data.claims = doc
    notes: dict[str, str] = {}
    judged: dict[str, dict] = {}  # accuracy claims: what the run's verdict says
    data.verdicts = evaluate(doc, measured_values(doc, data.runs, notes, judged), notes, judged)


# --- everything ---------------------------------------------------------------------------------------------


def load(
    results_dir: str | Path = "results", asv_conf: str | Path | None = None, claims_file: str | Path | None = None
) -> SiteData:
    results_dir = Path(results_dir)
    data = SiteData(results_dir=results_dir)
    if not results_dir.is_dir():
        data.problems.append(f"no results folder at {results_dir}")
    load_runs(results_dir, data)
    load_history(results_dir, Path(asv_conf) if asv_conf else None, data)
    load_accuracy(results_dir, data)
    load_kernels(results_dir, data)
    load_claims_data(data, Path(claims_file) if claims_file else None)
    return data
