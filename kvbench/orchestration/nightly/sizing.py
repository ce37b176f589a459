"""`kvbench plan`'s answer for a machine section's entries, as the nightly's dry run prints it: how many GPUs of
the section's type hold each (model, workload)'s concurrency at its context, per KV dtype."""

from __future__ import annotations

from kvbench.orchestration.nightly.estimate import model_spec
from kvbench.specs.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from kvbench.specs.formats import get_format
from kvbench.specs.plan import plan_row


def plan_rows(plan) -> list[dict]:
    """`kvbench plan`'s answer for each (model, workload): GPUs of this type to hold the workload's
    concurrency at its context, per dtype."""
    if not plan.on_gpu:
        return []
    out, seen = [], set()
    for e in plan.entries:
        spec = model_spec(e.model)
        users = max(e.concurrency)
        if spec is None or (e.model.name, e.workload) in seen:
            continue
        seen.add((e.model.name, e.workload))
        for dtype in e.kv_dtypes:
            row = plan_row(spec, get_format(dtype), plan.gpu, users, e.context, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
            out.append(
                {
                    "model": e.model.name,
                    "workload": e.workload,
                    "users": users,
                    "context": e.context,
                    "dtype": dtype,
                    "gpus": row.gpus,
                    "tensor_parallel": row.tensor_parallel,
                    "users_per_replica": row.users_per_replica,
                    "supported": row.supported,
                    "reason": row.reason,
                }
            )
    return out


def plan_lines(plan) -> list[str]:
    lines = []
    by: dict[tuple, list[dict]] = {}
    for r in plan_rows(plan):
        by.setdefault((r["model"], r["workload"], r["users"], r["context"]), []).append(r)
    for (model, workload, users, context), rows in by.items():
        head = f"kvbench plan, {workload}: {users:,} concurrent {context:,}-token {model} sequences need"
        tps = {r["tensor_parallel"] for r in rows}
        if all(r["supported"] for r in rows) and len(tps) == 1:
            gpus = ", ".join(f"{r['dtype']} {r['gpus']}" for r in rows)
            per = " / ".join(f"{r['users_per_replica']:,}" for r in rows)
            lines.append(f"{head} {gpus} x {plan.key} (TP {tps.pop()}; {per} sequences per replica)")
            continue
        parts = [
            f"{r['dtype']} {r['gpus']} (TP {r['tensor_parallel']}, {r['users_per_replica']:,} per replica)"
            if r["supported"]
            else f"{r['dtype']} unsupported ({r['reason']})"
            for r in rows
        ]
        lines.append(f"{head} {', '.join(parts)} x {plan.key}")
    return lines
