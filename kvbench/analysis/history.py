"""The tracked history as one table: asv's results (read with asv's own Results API) joined to the run
records that produced them, so every point carries its vLLM version, package, GPU, driver and CUDA.

A point is (machine, commit, asv environment). The serving benchmarks' `setup_cache` writes a run record
with an "asv" block {commit, env_name}; the newest record for the point that was written before the
point's benchmarks ran is the one that filled it (an older record for the same point was overwritten in
asv by a later run).
"""

from __future__ import annotations

import ast
import itertools
import math
from pathlib import Path

from kvbench.core.errors import UsageError
from kvbench.records import layout, linked_records
from kvbench.specs.tracked import by_benchmark, one_env

# The agreed shape of a history row (the dashboards' history frame has these); COLUMNS adds the rest.
SHAPE = [
    "machine",
    "commit",
    "commit_date",
    "run_id",
    "run_started",
    "vllm_package",
    "vllm_version",
    "gpu",
    "driver",
    "cuda",
    "metric",
    "label",
    "kv_dtype",
    "value",
    "unit",
    "direction",
]
COLUMNS = [
    *SHAPE,
    # beyond the agreed shape:
    "state",
    "dtype_status",
    "run_status",
    "env_name",
    "python",
    "benchmark",
    "record",
    # the point's own spread where the run repeated its fixed load (std of the repeats, in `unit`; their count)
    "repeat_std",
    "repeat_n",
]


def _load_asv(results_dir: Path, asv_conf: str | Path):
    from asv.benchmarks import Benchmarks
    from asv.config import Config

    try:
        conf = Config.load(str(asv_conf))
    except Exception as exc:  # asv raises its UserError, JSON and OS errors: all one line here
        raise UsageError(f"{asv_conf}: not a readable asv config ({' '.join(str(exc).split())[:200]})") from None
    conf.results_dir = str(results_dir)
    try:
        return Benchmarks.load(conf)
    except Exception as exc:
        raise UsageError(
            f"{Path(results_dir) / 'benchmarks.json'}: not a readable asv benchmarks.json "
            f"({' '.join(str(exc).split())[:200] or type(exc).__name__}); rerun `kvbench history run`"
        ) from None


def _records(machine_dir: Path, problems: list[str]) -> dict[tuple[str, str], list[tuple[str, dict, Path]]]:
    """(commit, env_name) -> [(created_at, record, path)] for the records that name an asv point."""
    out: dict = {}
    for created, doc, path in linked_records(machine_dir, problems):
        key = (doc["asv"]["commit"], one_env(doc["asv"].get("env_name")))  # path-named envs of old records too
        out.setdefault(key, []).append((created, doc, path))
    return out


def _machine_results(machine_dir: Path, machine: str, problems: list[str]):
    """asv Results of one machine folder. Not asv's iter_results: that walks into runs/, kernels/ and
    accuracy/ and warns about each (they have no machine.json). A file that is not a readable asv result
    (truncated, `{}`, values that are not numbers) is named in `problems`, never half-read."""
    from asv.results import Results
    from asv.util import UserError

    for path in sorted(machine_dir.glob("*.json")):
        if path.name in ("machine.json", "benchmarks.json") or path.name.startswith("."):
            continue
        try:
            res = Results.load(str(path), machine_name=machine)
            bad = bad_value(res)
        except (UserError, ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
            problems.append(f"{path}: corrupt asv result ({' '.join(str(exc).split())[:200]})")
            continue
        if bad:
            problems.append(f"{path}: corrupt asv result ({bad})")
            continue
        yield res


def bad_value(res) -> str | None:
    """Why an asv result cannot be believed: a value that is not a number (or null: NaN, not measured), an
    infinite one, a negative one (every benchmark here times, counts or measures something that cannot be: a
    -1e9 s TTFT is damage, not an improvement), a fraction above 1, or no commit."""
    if not isinstance(res.commit_hash, str) or not res.commit_hash:
        return "no commit hash"
    units = {name: m.unit for name, m in by_benchmark().items()}
    for key in res.get_all_result_keys():
        unit = next((u for name, u in units.items() if key.endswith(name)), None)
        for value in res._results.get(key) or []:
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"{key} holds {value!r}, not a number"
            if math.isinf(value):
                return f"{key} holds {value!r}, not a finite number"
            if value < 0:
                return f"{key} holds {value!r}, but {unit or 'a benchmark value'} cannot be negative"
            if unit == "fraction" and value > 1:
                return f"{key} holds {value!r}, but a fraction is at most 1"
    return None


def _iso_ms(ms) -> str | None:
    import pandas as pd

    return None if ms is None else pd.Timestamp(ms, unit="ms", tz="UTC").isoformat()


def _pick_record(candidates, started_ms) -> tuple[dict, Path] | tuple[None, None]:
    import pandas as pd

    if not candidates:
        return None, None
    if started_ms is not None:
        cutoff = pd.Timestamp(started_ms, unit="ms", tz="UTC")
        before = [c for c in candidates if c[0] and pd.Timestamp(c[0]) <= cutoff]
        candidates = before or candidates
    created, doc, path = max(candidates, key=lambda c: c[0])
    return doc, path


def _env_from_record(doc: dict | None) -> dict:
    if not doc:
        return {}
    env = doc.get("environment") or {}
    gpus = env.get("gpus") or []
    return {
        "vllm_package": (env.get("vllm") or {}).get("package"),
        "vllm_version": (env.get("vllm") or {}).get("version"),
        "gpu": gpus[0]["name"] if gpus else "none",
        "driver": env.get("driver") or "none",
        "cuda": env.get("cuda_driver") or "none",
    }


def history_frame(results_dir="results", asv_conf="asv.conf.json", problems: list[str] | None = None):
    """pandas DataFrame, one row per (machine, commit, env, metric, kv_dtype), in each machine's run order.

    Columns: machine, commit, commit_date (UTC), run_id, run_started (UTC), vllm_package, vllm_version, gpu,
    driver, cuda, metric, label, kv_dtype, value (in `unit`; NaN when skipped or failed), unit, direction,
    and: state ("ok" | "skipped" (n/a on this machine/version) | "failed"), dtype_status (the run record's
    status for that dtype: ok, partial, failed, unsupported), run_status, env_name, python, benchmark, record.
    """
    import pandas as pd

    problems = [] if problems is None else problems
    results_dir = Path(results_dir)
    if not (results_dir / "benchmarks.json").is_file():  # no asv run yet: an empty history, not an error
        return _typed(pd.DataFrame(columns=COLUMNS))
    benchmarks = _load_asv(results_dir, asv_conf)
    tracked = by_benchmark()
    rows = []
    machines = (
        sorted(p.name for p in results_dir.iterdir() if (p / "machine.json").is_file()) if results_dir.is_dir() else []
    )
    for machine in machines:
        records = _records(folder := layout.machine_dir(results_dir, machine), problems)
        for res in _machine_results(folder, machine, problems):
            keys = [k for k in res.get_result_keys(benchmarks) if k in tracked]
            serving = [res.started_at[k] for k in keys if tracked[k].source == "run" and res.started_at.get(k)]
            started = (
                min(serving)
                if serving
                else min((res.started_at[k] for k in keys if res.started_at.get(k)), default=None)
            )
            doc, path = _pick_record(records.get((res.commit_hash, one_env(res.env_name))), started)
            run_env = _env_from_record(doc)
            params = res.params
            point = {
                "machine": machine,
                "commit": res.commit_hash,
                "commit_date": _iso_ms(res.date),
                "run_id": doc.get("run_id") if doc else None,
                "run_started": (doc.get("created_at") if doc else None) or _iso_ms(started),
                "vllm_package": run_env.get("vllm_package"),
                "vllm_version": run_env.get("vllm_version"),
                # asv's machine fields (kvbench writes them); the record's view for plain `asv run` machines
                "gpu": params.get("gpu") or run_env.get("gpu"),
                "driver": params.get("driver") or run_env.get("driver"),
                "cuda": params.get("cuda") or run_env.get("cuda"),
                "run_status": doc.get("status") if doc else None,
                "env_name": res.env_name,  # as filed (a series is per machine, whatever the environment)
                "python": res.params.get("python"),
                "record": str(path) if path else None,
            }
            statuses = {d.get("kv_cache_dtype"): d.get("status") for d in (doc or {}).get("dtypes", [])}
            repeated = {d.get("kv_cache_dtype"): d.get("fixed_stats") or {} for d in (doc or {}).get("dtypes", [])}
            for key in keys:
                metric = tracked[key]
                bparams = benchmarks[key]["params"]
                values = res.get_result_value(key, bparams)
                for combo, value in zip(itertools.product(*bparams), values, strict=False):
                    dtype = ast.literal_eval(combo[0])
                    state = "failed" if value is None else ("skipped" if math.isnan(value) else "ok")
                    rep = (repeated.get(dtype) or {}).get(metric.field) or {} if metric.source == "run" else {}
                    rows.append(
                        {
                            **point,
                            "metric": metric.name,
                            "label": metric.label,
                            "kv_dtype": dtype,
                            "value": math.nan if value is None else float(value),
                            "unit": metric.unit,
                            "direction": metric.direction,
                            "state": state,
                            "dtype_status": statuses.get(dtype) if metric.source == "run" else None,
                            "benchmark": key,
                            "repeat_std": rep["std"] * metric.scale if rep.get("std") is not None else math.nan,
                            "repeat_n": rep.get("n") or 1,
                        }
                    )
    frame = _typed(pd.DataFrame(rows, columns=COLUMNS))
    return frame.sort_values(
        ["machine", "run_started", "commit_date", "metric", "kv_dtype"], kind="stable"
    ).reset_index(drop=True)


def _typed(frame):
    import pandas as pd

    for col in ("commit_date", "run_started"):
        frame[col] = pd.to_datetime(frame[col], utc=True, format="ISO8601")
    frame["value"] = frame["value"].astype(float)
    return frame


def points(frame):
    """One row per history point (machine, commit, env) with its run, vLLM and machine columns, in order."""
    cols = [*SHAPE[: SHAPE.index("metric")], "run_status", "env_name"]  # the shape's per-point columns
    return frame[cols].drop_duplicates(["machine", "commit", "env_name"]).reset_index(drop=True)
