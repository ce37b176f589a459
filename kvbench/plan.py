"""How many GPUs a target of concurrent users needs per KV-cache dtype, and what they cost per hour.

Per GPU type and dtype, kvbench tries tensor-parallel sizes 1, 2, 4, 8 (a model that does not fit
on one GPU needs TP), computes users per replica from the page-accurate capacity model, caps them
at vLLM's max_num_seqs, and keeps the smallest GPU count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.capacity import Budget, budget_from_bytes, budget_from_gpu, capacity_row
from kvbench.formats import CacheFormat
from kvbench.gpus import GpuSpec
from kvbench.models import ModelSpec

TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class PlanRow:
    gpu: str
    dtype: str
    supported: bool
    reason: str | None
    tensor_parallel: int | None
    users_per_replica: int  # after the scheduler cap
    kv_limited_users: int  # what the KV cache alone would hold
    limited_by: str  # "kv cache" or "max_num_seqs"
    replicas: int | None
    gpus: int | None
    usd_per_hour: float | None
    kv_budget_bytes: float | None


def plan_row(
    model: ModelSpec,
    fmt: CacheFormat,
    gpu: GpuSpec,
    users: int,
    context: int,
    utilization: float,
    kv_budget_gb: float | None = None,
    overhead_gb: float = 0.0,
    max_num_seqs: int | None = None,
    price_per_hour: float | None = None,
) -> PlanRow:
    def budget_for(tp: int) -> Budget:
        if kv_budget_gb is not None:
            return budget_from_bytes(kv_budget_gb * 1e9 * tp, "given per GPU")
        return budget_from_gpu(gpu, model, utilization, overhead_gb * 1e9, num_gpus=tp)

    best: PlanRow | None = None
    reason = None
    for tp in TP_SIZES:
        budget = budget_for(tp)
        row = capacity_row(model, fmt, context, budget, gpu)
        reason = row.reason
        if row.reason or row.users < 1:
            continue
        cap = max_num_seqs or row.scheduler_cap or row.users
        per_replica = min(row.users, cap)
        replicas = math.ceil(users / per_replica)
        candidate = PlanRow(
            gpu=gpu.key,
            dtype=fmt.key,
            supported=True,
            reason=None,
            tensor_parallel=tp,
            users_per_replica=per_replica,
            kv_limited_users=row.users,
            limited_by="max_num_seqs" if cap < row.users else "kv cache",
            replicas=replicas,
            gpus=replicas * tp,
            usd_per_hour=replicas * tp * price_per_hour if price_per_hour is not None else None,
            kv_budget_bytes=budget.kv_bytes,
        )
        if best is None or candidate.gpus < best.gpus:
            best = candidate
    if best is None:
        why = reason or f"the weights ({model.weight_bytes / 1e9:.1f} GB) leave no KV room even at TP={TP_SIZES[-1]}"
        return PlanRow(gpu.key, fmt.key, False, why, None, 0, 0, "", None, None, None, None)
    return best
