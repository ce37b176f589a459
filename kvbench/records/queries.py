"""Finding and reading records for reports: which records are where, the headline numbers a reader compares
across dtypes, and the tables (pandas) that `report`, `compare`, `claims`, `history` and the dashboards use."""

from __future__ import annotations

from pathlib import Path

from kvbench.core.datafiles import read_json
from kvbench.core.errors import UsageError
from kvbench.records.layout import RUNS_DIR
from kvbench.records.migrate import v1_samples
from kvbench.records.schema import CONDITIONS, SCHEMA_V1, SPEED_FIELDS, PhaseKind, RunRecord
from kvbench.records.storage import load_record, parse_record, read_record, sample_schema


def find_records(where: str | Path) -> list[Path]:
    """A record file, or every run record under a folder (results/, results/<machine>/, or a runs/ folder)."""
    where = Path(where)
    if where.is_file():
        return [where]
    if not where.is_dir():
        raise UsageError(f"no run records at {where}")
    pattern = "*.json" if where.name == RUNS_DIR else f"{RUNS_DIR}/*.json"
    found = where.glob(pattern) if where.name == RUNS_DIR else where.rglob(pattern)
    return sorted(p for p in found if not p.name.startswith(".") and not p.is_dir())  # a folder is no record


# Every run record a reader left out as unreadable in this process, in order: what was shown without it is
# still shown, and the command then exits 2 naming how many (kvbench.cli.app.main), so damage is never silent.
_SKIPPED: list[str] = []


def wall_seconds(doc: dict, statuses: tuple[str, ...] = ("complete",)) -> float | None:
    """How long a run took, finished_at - created_at, for a record whose status is one of `statuses`; None for
    another status, a missing or unreadable time, or a non-positive span."""
    from datetime import datetime

    if doc.get("status") not in statuses:
        return None
    try:
        s = (datetime.fromisoformat(doc["finished_at"]) - datetime.fromisoformat(doc["created_at"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None
    return s if s > 0 else None


def newest_run_of(where: str | Path, model: str) -> tuple[str, float] | None:
    """(run id, wall minutes) of the newest complete run record of `model` (config.model_name) under `where`, or
    None: how long the model's whole run took when it last ran here."""
    best = None
    for path in find_records(where) if Path(where).exists() else []:
        try:
            doc = read_json(path)
        except UsageError:  # unreadable: not a timing
            continue
        if (doc.get("config") or {}).get("model_name") != model or (took := wall_seconds(doc)) is None:
            continue
        if best is None or doc["created_at"] > best[0]:
            best = (doc["created_at"], doc["run_id"], took / 60)
    return (best[1], best[2]) if best else None


def note_skipped(problem: str) -> str:
    """Count a record left out as unreadable (returns `problem`, for the caller's own list)."""
    _SKIPPED.append(problem)
    return problem


def skipped_records() -> list[str]:
    """The records left out as unreadable so far in this process (note_skipped)."""
    return list(_SKIPPED)


def read_records(paths: list[Path]) -> tuple[list[tuple[Path, RunRecord]], list[str]]:
    """Every readable record among `paths`, and one line per one that is not (named, never believed)."""
    good, problems = [], []
    for p in paths:
        try:
            good.append((p, read_record(p)))
        except UsageError as exc:
            problems.append(note_skipped(f"skipped {exc}"))
    return good, problems


def linked_records(machine_dir: Path, problems: list[str] | None = None) -> list[tuple[str, dict, Path]]:
    """(created_at, record, path) of every readable run record in a machine folder that names an asv
    history point (its `asv` block: commit and env name), oldest first. Unreadable ones are named in
    `problems` when given."""
    out = []
    for path in sorted((Path(machine_dir) / RUNS_DIR).glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            doc = load_record(path)
        except UsageError as exc:
            if problems is not None:
                problems.append(note_skipped(f"skipped {exc}"))
            continue
        asv = doc.get("asv")
        if isinstance(asv, dict) and isinstance(asv.get("commit"), str):
            out.append((str(doc.get("created_at") or ""), doc, path))
    return sorted(out, key=lambda item: item[0])


# -- tables ------------------------------------------------------------------------------------------------


def fixed_phase(dtype_result: dict) -> dict | None:
    """The headline fixed-load phase of a dtype result document (the first FIXED phase)."""
    return next((p for p in dtype_result.get("phases") or [] if p.get("kind") == PhaseKind.FIXED), None)


def representative(numbers: dict, emulated: bool) -> dict:
    """Headline numbers with the speed ones blanked (None) for an emulated dtype."""
    if not emulated:
        return dict(numbers)
    return {k: (None if k in SPEED_FIELDS else v) for k, v in numbers.items()}


def headline(dtype_result: dict) -> dict:
    """The numbers a reader compares across dtypes, from the fixed-load phase and the capacity block."""
    cap = dtype_result.get("capacity") or {}
    engine, model, measured = cap.get("engine") or {}, cap.get("model") or {}, cap.get("measured") or {}
    s = (fixed_phase(dtype_result) or {}).get("summary") or {}
    vs_auto = (dtype_result.get("agreement") or {}).get("vs_auto") or {}
    repeated = dtype_result.get("fixed_stats") or {}

    def stat(metric: str, p: str):
        if f"{metric[:-3]}_{p}_ms" in repeated:  # the mean over the repeats, where there were repeats
            return repeated[f"{metric[:-3]}_{p}_ms"]["mean"]
        return (s.get(metric) or {}).get(p)

    def value(key: str):
        return repeated[key]["mean"] if key in repeated else s.get(key)

    return {
        "engine_kv_tokens": engine.get("kv_tokens"),
        "engine_max_concurrency": engine.get("max_concurrency"),
        "model_kv_tokens": model.get("kv_tokens"),
        "model_max_concurrency": model.get("max_concurrency"),
        "measured_max_concurrency": measured.get("max_concurrency"),
        "ttft_p50_ms": stat("ttft_ms", "p50"),
        "ttft_p95_ms": stat("ttft_ms", "p95"),
        "tpot_p50_ms": stat("tpot_ms", "p50"),
        "tpot_p95_ms": stat("tpot_ms", "p95"),
        "itl_p95_ms": stat("itl_ms", "p95"),
        "e2e_p95_ms": stat("e2e_ms", "p95"),
        "request_throughput_rps": value("request_throughput_rps"),
        "output_throughput_tps": value("output_throughput_tps"),
        "goodput_rps": value("goodput_rps"),
        "completed": s.get("completed"),
        "failed": s.get("failed"),
        "greedy_agreement": vs_auto.get("token_agreement"),
        "logprob_delta_mean": vs_auto.get("logprob_delta_mean"),
        "prefix_hit_rate": _prefix_hit_rate(dtype_result),
        "task_accuracy_rest": _first_task_accuracy(dtype_result, "rest"),
        "task_accuracy_load": _first_task_accuracy(dtype_result, "load"),
        **_fidelity_numbers(dtype_result),
    }


def _fidelity_numbers(dtype_result: dict) -> dict:
    """Mean KLD and top-1 agreement vs auto at rest (harness/quality/fidelity.py), at rest and at load (auto: its
    floor)."""
    fid = dtype_result.get("fidelity") or {}
    out = {}
    for cond in ("rest", "load"):
        s = fid.get(cond) if isinstance(fid.get(cond), dict) else {}
        out[f"fidelity_kld_{cond}"] = s.get("mean_kld")
        out[f"fidelity_top1_{cond}"] = s.get("top1_agreement")
    return out


def workload_label(cfg: dict) -> str:
    """The traffic a run sent, for titles and tables: the workload spec's kind and parameters, else 'fixed P+O'."""
    spec = cfg.get("workload_spec")
    if spec:
        params = ", ".join(
            f"{k}={v}"
            for k, v in spec.items()
            if k not in ("kind", "name") and v is not None and not isinstance(v, (dict, list))
        )
        return (
            f"{spec.get('kind')} ({spec.get('name') or params})"
            if spec.get("name")
            else f"{spec.get('kind')} ({params})"
        )
    w = cfg.get("workload") or {}
    return f"fixed {w.get('prompt_tokens')}+{w.get('output_tokens')} tokens"


def _prefix_hit_rate(dtype_result: dict) -> float | None:
    """vLLM's prefix-cache hit rate (tokens) over the fixed phases, where the server reported it."""
    q = h = 0.0
    for p in dtype_result.get("phases") or []:
        pc = p.get("prefix_cache") or {}
        if p.get("kind") == PhaseKind.FIXED and pc.get("queries_tokens"):
            q += pc["queries_tokens"]
            h += pc.get("hits_tokens") or 0.0
    return h / q if q else None


def conditions(evals: dict | None):
    """(condition, summary) for each condition a dtype's `eval` holds; its other keys (`error`) are not one."""
    for cond in CONDITIONS:
        summary = (evals or {}).get(cond)
        if isinstance(summary, dict):
            yield cond, summary


def _first_task_accuracy(dtype_result: dict, condition: str) -> float | None:
    """Accuracy of the first eval task in a condition (the tracked number; every task is in the record)."""
    tasks = ((dtype_result.get("eval") or {}).get(condition) or {}).get("tasks") or {}
    first = next(iter(tasks.values()), None)
    return first.get("accuracy") if first else None


def summary_rows(doc: dict, path: Path | None = None) -> list[dict]:
    env = doc.get("environment") or {}
    vllm = env.get("vllm") or {}
    config = doc.get("config") or {}
    rows = []
    for d in doc.get("dtypes", []):
        model = ((d.get("capacity") or {}).get("model")) or {}
        server = d.get("server") or {}
        rows.append(
            {
                "run_id": doc.get("run_id"),
                "created_at": doc.get("created_at"),
                "machine": doc.get("machine"),
                "run_status": doc.get("status"),
                "vllm_package": vllm.get("package"),
                # an --endpoint run measured the server's vLLM (its /version), never this machine's install
                "vllm_version": (server.get("vllm_version") or "unknown")
                if not server.get("managed", True)
                else vllm.get("version"),
                "model": config.get("model_name") or config.get("model"),
                "kv_cache_dtype": d.get("kv_cache_dtype"),
                "kv_dtype_confirmed": d.get("kv_dtype_confirmed"),
                "emulated": bool(d.get("emulated")),
                "status": d.get("status"),
                "error": d.get("error"),
                "context": model.get("context") or config.get("max_model_len"),
                "budget_bytes": model.get("budget_bytes"),  # the engine's KV memory
                "workload_kind": (config.get("workload_spec") or {}).get("kind") or "fixed",
                **headline(d),
                "path": str(path) if path else None,
            }
        )
    return rows


def summary_frame(where: str | Path | list[Path], problems: list[str] | None = None):
    """pandas DataFrame, one row per (run, dtype), from a record, a folder of records, or a list of paths.

    A damaged record is skipped and named in `problems` when given; without it, the first one raises."""
    import pandas as pd

    paths = where if isinstance(where, list) else find_records(where)
    rows = []
    for p in paths:
        try:
            doc = load_record(p)
        except UsageError as exc:
            if problems is None:
                raise
            problems.append(note_skipped(f"skipped {exc}"))
            continue
        rows += summary_rows(doc, p)
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["created_at"] = pd.to_datetime(frame["created_at"], utc=True)
        frame = frame.sort_values(["created_at", "kv_cache_dtype"]).reset_index(drop=True)
    return frame


def samples_frame(where: str | Path | list[Path], table: str = "requests"):
    """pandas DataFrame of the samples of every record under `where`: table "requests" (one row per request,
    agreement requests included) or "series" (/metrics and NVML in long form). v2 records read their Parquet
    file; v1 records their embedded requests. A record whose samples are not on this disk contributes none."""
    import pandas as pd
    import pyarrow.parquet as pq

    if table not in ("requests", "series", "evals", "fidelity"):
        raise UsageError(f"unknown samples table {table!r}; choose from: requests, series, evals, fidelity")
    paths = where if isinstance(where, list) else find_records(where)
    frames = []
    for p in paths:
        doc = read_json(p, missing=f"run record not found: {p}", bad="not a JSON run record")
        record = parse_record(doc, p)
        if record.schema_ == SCHEMA_V1:
            if table in ("requests", "series"):  # v1 records had no evaluations
                frames.append(v1_samples(doc, table))
            continue
        name = getattr(record.samples, table, None) if record.samples else None
        file = Path(p).with_name(name) if name else None
        if file is not None and file.is_file():
            try:
                frames.append(pq.read_table(file).to_pandas())
            except Exception as exc:  # pyarrow's ArrowInvalid, OSError on a truncated or foreign file (K-P13)
                reason = " ".join(str(exc).split())[:160]
                raise UsageError(f"{file}: damaged {table} samples ({reason}); restore the file or remove it") from None
    frames = [f for f in frames if not f.empty]
    if not frames:
        return sample_schema(table).empty_table().to_pandas()
    return pd.concat(frames, ignore_index=True)
