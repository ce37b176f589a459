"""One run record as the rows of the pages' tables: per dtype (`run_rows`: the record's summary rows plus the
GPU, context, budget, SLO, workload, interval and quality columns the pages show), per accuracy condition, per
canary tally, per point of a trade-off front, per SLO-search probe. dashboards/data.py reads the records and
stacks these rows into SiteData's frames.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from kvbench import records as run_records
from kvbench.records import PhaseKind, conditions, workload_label
from kvbench.records.findings import FindingKind

ACCURACY_FORMAT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@lru_cache(maxsize=64)
def model_spec(name: str | None, path: str | None):
    """The ModelSpec a run served (kvbench.specs.models.spec_for: the run's own config first, then its name)."""
    from kvbench.core.tinyconfig import NAME
    from kvbench.specs.models import spec_for

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
    """The SLO verdict for a phase summary, by the harness's own rule (kvbench.harness.run.slo.SLO)."""
    if not slo:
        return None, "no SLO in the run's config"
    from kvbench.harness.run.slo import SLO

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
    """The run's quality gate for this dtype (harness/quality/underload.py): eligible or not, and why."""
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
