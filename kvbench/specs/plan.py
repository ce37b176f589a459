"""How many GPUs a target of concurrent users needs per KV-cache dtype, and what they cost per hour.

Per GPU type and dtype, kvbench tries tensor-parallel sizes 1, 2, 4, 8 (a model that does not fit
on one GPU needs TP), computes users per replica from the page-accurate capacity model, caps them
at vLLM's max_num_seqs, and keeps the smallest GPU count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvbench.specs.capacity import Sizing, capacity_for_ranks
from kvbench.specs.formats import CacheFormat
from kvbench.specs.gpus import GpuSpec
from kvbench.specs.modelspec import ModelSpec

TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Layout:
    """The vLLM settings a plan holds fixed for every GPU and dtype: the TP sizes it tries, and the sizing
    settings (the pipeline stages, the weight format, the release whose accounting it models, the tokens per
    step; plan_row's own utilization and max_num_seqs take the place of the sizing's)."""

    tensor_parallel_sizes: tuple[int, ...] = TP_SIZES
    sizing: Sizing = Sizing()


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
    utilization: float | None,
    kv_budget_gb: float | None = None,
    overhead_gb: float | None = None,
    max_num_seqs: int | None = None,
    price_per_hour: float | None = None,
    layout: Layout = Layout(),
) -> PlanRow:
    """The cheapest replica layout: per TP size, vLLM's capacity with the same non-KV terms as
    `kvbench capacity` (kvbench.specs.vllm_memory), users capped at max_num_seqs, replicas to reach `users`."""
    best: PlanRow | None = None
    reason = None
    sizing = replace(layout.sizing, gpu_memory_utilization=utilization, max_num_seqs=max_num_seqs)
    for tp in layout.tensor_parallel_sizes:
        est = sizing.non_kv(model, gpu, tp, context)
        pool = kv_budget_gb * 1e9 if kv_budget_gb is not None else None
        overhead = overhead_gb * 1e9 if overhead_gb is not None else None
        row = capacity_for_ranks(model, [fmt], context, est, gpu, pool_bytes=pool, overhead_bytes=overhead)[0]
        reason = row.reason
        if row.reason or row.users < 1:
            continue
        cap = est.scheduler.max_num_seqs
        per_replica = min(row.users, cap)
        replicas = math.ceil(users / per_replica)
        per_gpu = (
            min(s.kv_pool.bytes for s in est.stages)
            if pool is None and overhead is None
            else (pool if pool is not None else min(s.requested.bytes - s.weights.bytes - overhead for s in est.stages))
        )
        group = tp * sizing.pipeline_parallel_size
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
            gpus=replicas * group,
            usd_per_hour=replicas * group * price_per_hour if price_per_hour is not None else None,
            kv_budget_bytes=per_gpu * tp,
        )
        if best is None or candidate.gpus < best.gpus:
            best = candidate
    if best is None:
        why = reason or (
            f"the weights ({model.weight_bytes / 1e9:.1f} GB) leave no KV room "
            f"even at TP={layout.tensor_parallel_sizes[-1]}"
        )
        return PlanRow(gpu.key, fmt.key, False, why, None, 0, 0, "", None, None, None, None)
    return best


def plan_from_front(record, users: int, user_tps: float | None, prices: dict[str, float]) -> list[dict]:
    """Per dtype of a run record: users per replica read off its measured front (at `user_tps` tokens/s per
    user by PCHIP interpolation, else its best point under the SLO), replicas and GPUs for `users`, and USD per
    hour with the machine's price (from `prices`, else the price the run was given)."""
    import math

    from kvbench.core import front as fr

    rows = []
    for d in record.dtypes:
        row = {
            "kv_cache_dtype": d.kv_cache_dtype,
            "users_per_replica": None,
            "user_tps": None,
            "output_tps_per_gpu": None,
            "gpus_per_replica": None,
            "replicas": None,
            "gpus": None,
            "usd_per_hour": None,
            "why": "",
        }
        rows.append(row)
        if d.emulated:  # K-B14: its speed is the emulation's, never a deployment's
            row["why"] = "emulated: speed not representative, not sized"
            continue
        if d.status == "failed":  # K-P12: nothing it measured is believed
            row["why"] = f"failed in this run ({(d.error or 'no error recorded')[:120]}), not sized"
            continue
        if d.front is None:
            row["why"] = f"no front in the record ({d.status})"
            continue
        points = [
            fr.Point(**{k: v for k, v in p.items() if k in fr.Point.__dataclass_fields__}) for p in d.front.points
        ]
        if user_tps is not None:
            at = fr.at_interactivity(points, user_tps)
            if at is None:
                row["why"] = f"the front does not reach {user_tps:g} tok/s per user"
                continue
            conc, tps, row["why"] = at["concurrency"], at["output_tps_per_gpu"], "front, PCHIP"
        else:
            best = fr.best_under_slo(points)
            if best is None:
                row["why"] = "no measured point met the SLO"
                continue
            conc, tps, user_tps_here = best.concurrency, best.output_tps_per_gpu, best.user_tps
            row["why"] = f"best point under the SLO (concurrency {best.concurrency})"
        if not tps or tps <= 0 or not conc or conc < 1:  # a point that served nobody sizes nothing
            row["why"] = f"the front's point at concurrency {conc} has no output throughput ({tps} tokens/s)"
            continue
        per_replica = max(1, math.floor(conc))
        replicas = math.ceil(users / per_replica)
        price = (
            prices.get(d.front.price_key or "", d.front.price_per_gpu_hour)
            if d.front.price_key
            else (next(iter(prices.values())) if len(prices) == 1 else None)
        )
        row.update(
            users_per_replica=per_replica,
            user_tps=user_tps if user_tps is not None else user_tps_here,
            output_tps_per_gpu=tps,
            gpus_per_replica=d.front.gpus,
            replicas=replicas,
            gpus=replicas * d.front.gpus,
            usd_per_hour=replicas * d.front.gpus * price if price is not None else None,
        )
        if d.status != "ok":  # a partial dtype's front is what it measured before it stopped: say so
            row["why"] += f"; the dtype ended {str(d.status)} ({(d.error or 'no error recorded')[:120]})"
    return rows
