"""Everything the pages show, read once from a results folder into pandas frames.

Pages only read a `SiteData`; nothing here runs a benchmark. A file that cannot be read is skipped and
named in `problems`, so one bad record never hides the rest (the overview page lists them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from kvbench import records as run_records
from kvbench.analysis.history import SHAPE as HISTORY_COLUMNS
from kvbench.core.errors import KvbenchError
from kvbench.dashboards.record_rows import canary_rows, front_rows, probe_rows, quality_rows, run_rows

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
REGRESSION = "regression"  # kvbench.analysis.regress's verdict for a change past the allowed band in the bad direction


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
    verdicts: list = field(default_factory=list)  # kvbench.analysis.claims.Verdict
    problems: list[str] = field(default_factory=list)


# --- run records -------------------------------------------------------------------------------------


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


# --- history and regressions (kvbench.analysis.history / kvbench.analysis.regress) ------------------------------------


def load_history(results_dir: Path, asv_conf: Path | None, data: SiteData) -> None:
    from kvbench.analysis import history

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
    from kvbench.analysis import regress

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
    from kvbench.analysis.claims import evaluate, load_claims, measured_values

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
