"""The rows `kvbench report` prints around its tables, read out of one run record's document: per-dtype
overheads, agreement with auto, the client's scheduling, workload capacity, prefix cache, non-KV memory and
the paired comparisons (kvbench/cli/commands/report_sections.py formats them)."""

from __future__ import annotations

from kvbench.records.queries import fixed_phase

# (term in the prediction, key in the log's figures) of the non-KV memory line
NON_KV_PAIRS = (
    ("weights", "weights_gib"),
    ("activation", "activation_gib"),
    ("non_torch", "non_torch_gib"),
    ("cudagraph", "cudagraph_gib"),
    ("kv_pool", "kv_pool_gib"),
)


def served_versions(doc: dict) -> list[str]:
    """The vLLM versions the dtypes' servers reported, sorted."""
    served = {(d.get("server") or {}).get("vllm_version") for d in doc.get("dtypes", []) if d.get("server")}
    return sorted(v for v in served if v)


def endpoint_rows(doc: dict) -> list[tuple[dict, dict]]:
    """(dtype result, its server) for every dtype measured on an endpoint kvbench did not start."""
    return [(d, s) for d in doc.get("dtypes", []) if (s := d.get("server") or {}) and not s.get("managed", True)]


def overheads(doc: dict) -> dict[str, float]:
    """dtype -> bytes vLLM kept back besides weights and KV (activations, CUDA graphs), where measured."""
    found = {
        d["kv_cache_dtype"]: ((d.get("capacity") or {}).get("model") or {}).get("activation_overhead_bytes")
        for d in doc.get("dtypes", [])
    }
    return {k: v for k, v in found.items() if v is not None}


def agreement_rows(doc: dict) -> list[tuple[str, dict]]:
    """(dtype, its free-running agreement with auto) for every dtype that has one."""
    agree = [(d["kv_cache_dtype"], (d.get("agreement") or {}).get("vs_auto")) for d in doc.get("dtypes", [])]
    return [(dtype, a) for dtype, a in agree if a]


def client_schedule(doc: dict) -> tuple[list[str], float | None] | None:
    """(the client's scheduling policies, the largest share of a fixed phase it waited for a CPU), None
    without a fixed phase."""
    fixed_phases = [p for p in (fixed_phase(d) for d in doc.get("dtypes", [])) if p]
    if not fixed_phases:
        return None
    policies = sorted({(p.get("summary") or {}).get("client_policy") or "unknown" for p in fixed_phases})
    waits = [(p.get("summary") or {}).get("client_runqueue_wait_fraction") for p in fixed_phases]
    waits = [w for w in waits if w is not None]
    return policies, (max(waits) if waits else None)


def workload_capacity_rows(doc: dict) -> list[tuple[str, dict]]:
    """(dtype, its capacity at the workload's own lengths) for every dtype that has one."""
    rows = [(d["kv_cache_dtype"], (d.get("capacity") or {}).get("distribution")) for d in doc.get("dtypes", [])]
    return [(k, v) for k, v in rows if v]


def prefix_cache_rows(doc: dict) -> list[tuple[str, dict]]:
    """(dtype, phase) for every phase with prefix-cache figures; none when no phase queried the cache."""
    rows = [
        (d["kv_cache_dtype"], p) for d in doc.get("dtypes", []) for p in d.get("phases") or [] if p.get("prefix_cache")
    ]
    if all((p["prefix_cache"].get("queries_tokens") or 0) == 0 for _, p in rows):
        return []
    return rows


def comparison_rows(doc: dict) -> list[tuple[str, str, dict, bool]]:
    """(dtype, metric, paired difference to auto, the dtype is emulated) for every metric compared."""
    emulated = {d["kv_cache_dtype"] for d in doc.get("dtypes", []) if d.get("emulated")}
    return [
        (c["kv_cache_dtype"], m, v, c["kv_cache_dtype"] in emulated)
        for c in doc.get("comparisons") or []
        for m, v in (c.get("metrics") or {}).items()
    ]


def non_kv_rows(doc: dict) -> list[tuple[str, dict]]:
    """(dtype, its non-KV memory block: predicted terms and the log's, or an error) for every dtype with one."""
    return [(d["kv_cache_dtype"], nk) for d in doc.get("dtypes", []) if (nk := (d.get("capacity") or {}).get("non_kv"))]
