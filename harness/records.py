"""Run records: one versioned JSON document per `kvbench run`, written atomically to
results/<machine>/runs/<run_id>.json, beside that machine's asv results (so copying a machine's folder
carries everything it measured).

Schema `kvbench.run/1` (top level):
  schema, run_id, created_at (UTC ISO 8601), status ("complete" | "partial" | "failed" | "interrupted"),
  machine, config, environment, dtypes: [per-dtype result], findings: [{level, text}]
Per-dtype result:
  kv_cache_dtype, status ("ok" | "failed" | "partial"), error, log_path, log_tail (on failure),
  server {ready_after_s, base_url}, capacity {engine, model, measured}, phases: [{name, mode, summary,
  requests}], metrics {before, during, after}, telemetry
`summary_frame()` flattens records to one row per (run, dtype): the table `report`, asv, `regress` and
the dashboards read.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from kvbench.datafiles import read_json
from kvbench.errors import UsageError
from kvbench.output import jsonable

SCHEMA = "kvbench.run/1"
RUNS_DIR = "runs"


def new_run_id(machine: str, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{machine}-{secrets.token_hex(3)}"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def record_path(results_dir: Path, machine: str, run_id: str) -> Path:
    return Path(results_dir) / machine / RUNS_DIR / f"{run_id}.json"


def _micro(obj):
    """Floats to 6 decimals: request times are seconds from the run's start, so that is 1 µs, and per-chunk
    arrival lists (most of a record) shrink by half."""
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: _micro(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_micro(v) for v in obj]
    return obj


def write_atomic(path: Path, doc: dict) -> Path:
    """Write JSON so a reader never sees half a file: temp file in the same folder, fsync, rename.

    Compact (no indentation): records hold every request's chunk times and are committed nightly."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(_micro(jsonable(doc)), fh, separators=(",", ":"))
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; records are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_record(path: str | Path) -> dict:
    path = Path(path)
    doc = read_json(path, missing=f"run record not found: {path}", bad="not a JSON run record")
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith("kvbench.run/"):
        raise UsageError(f"{path}: not a kvbench run record (schema {schema!r}; expected {SCHEMA})")
    if schema != SCHEMA:
        raise UsageError(f"{path}: record schema {schema} is not supported by this kvbench (reads {SCHEMA})")
    return doc


def find_records(where: str | Path) -> list[Path]:
    """A record file, or every run record under a folder (results/, results/<machine>/, or a runs/ folder)."""
    where = Path(where)
    if where.is_file():
        return [where]
    if not where.is_dir():
        raise UsageError(f"no run records at {where}")
    if where.name == RUNS_DIR:
        return sorted(p for p in where.glob("*.json") if not p.name.startswith("."))
    return sorted(p for p in where.rglob(f"{RUNS_DIR}/*.json") if not p.name.startswith("."))


def linked_records(machine_dir: Path) -> list[tuple[str, dict, Path]]:
    """(created_at, record, path) of every readable run record in a machine folder that names an asv
    history point (its `asv` block: commit and env name), oldest first."""
    out = []
    for path in sorted((Path(machine_dir) / RUNS_DIR).glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a foreign or damaged file is not a history point
        if (doc.get("asv") or {}).get("commit"):
            out.append((str(doc.get("created_at") or ""), doc, path))
    return sorted(out, key=lambda item: item[0])


def _phase(dtype_result: dict, name: str) -> dict | None:
    for phase in dtype_result.get("phases", []):
        if phase.get("name") == name:
            return phase
    return None


def headline(dtype_result: dict) -> dict:
    """The numbers a reader compares across dtypes, from the fixed-load phase and the capacity block."""
    cap = dtype_result.get("capacity") or {}
    engine, model, measured = cap.get("engine") or {}, cap.get("model") or {}, cap.get("measured") or {}
    fixed = _phase(dtype_result, "fixed") or {}
    s = fixed.get("summary") or {}

    def stat(metric: str, p: str):
        return (s.get(metric) or {}).get(p)

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
        "request_throughput_rps": s.get("request_throughput_rps"),
        "output_throughput_tps": s.get("output_throughput_tps"),
        "goodput_rps": s.get("goodput_rps"),
        "completed": s.get("completed"),
        "failed": s.get("failed"),
        "greedy_agreement": ((dtype_result.get("agreement") or {}).get("vs_auto") or {}).get("token_agreement"),
        "logprob_delta_mean": ((dtype_result.get("agreement") or {}).get("vs_auto") or {}).get("logprob_delta_mean"),
    }


def summary_rows(doc: dict, path: Path | None = None) -> list[dict]:
    env = doc.get("environment") or {}
    vllm = env.get("vllm") or {}
    config = doc.get("config") or {}
    rows = []
    for d in doc.get("dtypes", []):
        model = ((d.get("capacity") or {}).get("model")) or {}
        rows.append(
            {
                "run_id": doc.get("run_id"),
                "created_at": doc.get("created_at"),
                "machine": doc.get("machine"),
                "run_status": doc.get("status"),
                "vllm_package": vllm.get("package"),
                "vllm_version": vllm.get("version"),
                "model": config.get("model_name") or config.get("model"),
                "kv_cache_dtype": d.get("kv_cache_dtype"),
                "status": d.get("status"),
                "error": d.get("error"),
                "context": model.get("context") or config.get("max_model_len"),
                "budget_bytes": model.get("budget_bytes"),  # the engine's KV memory
                **headline(d),
                "path": str(path) if path else None,
            }
        )
    return rows


def summary_frame(where: str | Path | list[Path]):
    """pandas DataFrame, one row per (run, dtype), from a record, a folder of records, or a list of paths."""
    import pandas as pd

    paths = where if isinstance(where, list) else find_records(where)
    rows = [row for p in paths for row in summary_rows(load_record(p), p)]
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["created_at"] = pd.to_datetime(frame["created_at"], utc=True)
        frame = frame.sort_values(["created_at", "kv_cache_dtype"]).reset_index(drop=True)
    return frame
