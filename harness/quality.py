"""Quality under load inside a run, and the gate on it: which dtypes may be recommended.

Each dtype's server is evaluated (kvbench.harness.evaluation: lm-evaluation-harness, temperature 0, every item
kept) in three conditions: at rest (one request at a time), at load (the run's serving concurrency: the
SLO-measured knee, else the fixed load) and during load (one request at a time while the fixed load's traffic
runs). lm-eval runs in a separate process, so its Python work never stalls the load generator's clock.

The gate (`gate`): a dtype is eligible for a recommendation only if, in every condition evaluated, its
accuracy is not significantly below auto's on the same items (McNemar exact, alpha 0.05) and its drop is within
the budget (default 1 point); its accuracy at load is not significantly below its own at rest; and no canary
came back different under load more often than auto's did. Otherwise it is "excluded: accuracy" (or
"excluded: accuracy at load"), with its numbers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
from dataclasses import dataclass

from kvbench.harness.evalrecord import _accuracy, _binary, _paired
from kvbench.harness.records import conditions

REFERENCE = "auto"
DEFAULT_BUDGET_POINTS = 1.0


@dataclass(frozen=True)
class EvalJob:
    base_url: str
    served_model: str
    tokenizer: str
    tasks: tuple[str, ...]
    num_concurrent: int
    limit: int | None
    headers: dict[str, str] | None
    max_length: int | None
    # per request: lm-eval's requests are not streamed, so no answer for this long is a hung server
    timeout_s: float = 300.0
    # SCHED_FIFO for the worker while it evaluates (the run's --realtime): on a small box whose server
    # busy-waits on every core, a normal-priority lm-eval can wait for a CPU for most of each request
    realtime: bool = False


def _evaluate(job: EvalJob):
    import os

    os.environ.setdefault("TQDM_DISABLE", "1")  # lm-eval's progress bars would interleave with the run's own
    from kvbench.harness.clientsched import Realtime
    from kvbench.harness.evaluation import evaluate

    with Realtime() if job.realtime else contextlib.nullcontext():
        return evaluate(
            job.base_url,
            job.served_model,
            job.tokenizer,
            list(job.tasks),
            num_concurrent=job.num_concurrent,
            limit=job.limit,
            headers=job.headers,
            max_length=job.max_length,
            timeout_s=job.timeout_s,
        )


class Evaluator:
    """lm-eval in one worker process for the whole run (its imports are paid once)."""

    def __init__(self):
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    async def run(self, job: EvalJob):
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn")
            )
        return await asyncio.get_running_loop().run_in_executor(self._pool, _evaluate, job)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def condition_summary(result, concurrency: int) -> dict:
    """{task: {metric, n, correct, accuracy, ci95}} and the items by task (doc id -> score) of one evaluation."""
    tasks = {}
    for name, tr in result.tasks.items():
        scores = tr.scores
        entry = {"metric": tr.metric, **_accuracy(scores)}
        if not _binary(scores):
            entry.update(accuracy=sum(scores) / len(scores) if scores else None, ci95=None)
        tasks[name] = entry
    return {"concurrency": concurrency, "wall_s": result.wall_s, "tasks": tasks}


def items_by_task(result) -> dict[str, dict[int, float]]:
    return {name: {i.doc_id: i.score for i in tr.items} for name, tr in result.tasks.items()}


def compare_conditions(
    evals: dict[str, dict[str, dict]], items: dict[tuple[str, str], dict[str, dict[int, float]]]
) -> None:
    """Add `vs_auto` (same condition) and `vs_rest` (same dtype) paired comparisons into `evals`
    ({dtype: {condition: condition_summary}}), from `items` ({(dtype, condition): {task: {doc: score}}})."""
    for dtype, conds in evals.items():
        for cond, summary in conditions(conds):
            for task, entry in summary["tasks"].items():
                mine = items.get((dtype, cond), {}).get(task, {})
                if dtype != REFERENCE and (REFERENCE, cond) in items:
                    entry["vs_auto"] = _paired(items[(REFERENCE, cond)].get(task, {}), mine)
                if cond != "rest" and (dtype, "rest") in items:
                    entry["vs_rest"] = _paired(items[(dtype, "rest")].get(task, {}), mine)


def gate(
    record, budget_points: float = DEFAULT_BUDGET_POINTS, budgets: dict[str, float] | None = None
) -> dict[str, dict]:
    """{dtype: {"eligible": bool, "reason": str}} from a run record's evaluations and canaries (typed record).
    `budgets`: points per task, overriding `budget_points` for that task."""
    out: dict[str, dict] = {}
    auto_canary = _canary_rate(record.dtype(REFERENCE)) if record.dtype(REFERENCE) else 0.0
    for d in record.dtypes:
        if d.status.value != "ok":
            out[d.kv_cache_dtype] = {"eligible": False, "reason": f"run {d.status.value}"}
            continue
        reasons = []
        for cond, summary in conditions(d.eval):
            for task, e in (summary.get("tasks") or {}).items():
                vs = e.get("vs_auto")
                budget = (budgets or {}).get(task, budget_points)
                # 1e-9: a drop of exactly the budget (1 item in 100 against a 1-point budget) is within it
                if vs and (vs["significant"] and vs["difference"] < 0 or -vs["difference"] * 100 > budget + 1e-9):
                    why = "significantly below auto" if vs["significant"] else f"more than the {budget:g}-point budget"
                    reasons.append(
                        f"accuracy{' at load' if cond != 'rest' else ''}: {task} {cond.replace('_', ' ')} "
                        f"{vs['difference'] * 100:+.1f} points vs auto, {why} (95% CI {vs['ci95'][0] * 100:+.1f}.."
                        f"{vs['ci95'][1] * 100:+.1f}, p = {vs['p_value']:.3g})"
                    )
                rest = e.get("vs_rest")
                if rest and rest["significant"] and rest["difference"] < 0:
                    reasons.append(
                        f"accuracy at load: {task} {cond.replace('_', ' ')} {rest['difference'] * 100:+.1f} points "
                        f"vs its own at rest (p = {rest['p_value']:.3g})"
                    )
        rate = _canary_rate(d)
        if d.kv_cache_dtype != REFERENCE and rate > auto_canary:
            reasons.append(
                f"accuracy at load: {rate:.0%} of canaries came back different under load (auto {auto_canary:.0%})"
            )
        sent = sum((p.canaries or {}).get("sent", 0) for p in d.phases)
        unchecked = "no evaluation in this run " + (
            "(canaries clean)" if sent else "and no canary sent: accuracy unchecked"
        )
        out[d.kv_cache_dtype] = {
            "eligible": not reasons,
            "reason": "; ".join(reasons) or ("accuracy within budget" if d.eval else unchecked),
        }
    return out


def _canary_rate(d) -> float:
    sent = differ = 0
    for p in d.phases:
        c = p.canaries or {}
        sent += c.get("sent", 0) - c.get("failed", 0)
        differ += c.get("differ", 0)
    return differ / sent if sent else 0.0


def recommend(record, gates: dict[str, dict]) -> dict:
    """The dtype with the highest SLO-measured concurrency among the eligible ones (ties to the more precise
    dtype), the best measured throughput under the SLO breaking a missing search; and why each other is not."""
    order = {"auto": 0, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 2, "nvfp4": 3}
    candidates, unranked = [], {}
    for d in record.dtypes:
        g = gates.get(d.kv_cache_dtype) or {}
        if not g.get("eligible"):
            continue
        if d.kv_dtype_confirmed is False:
            continue
        if d.emulated:  # its speed is the emulation's: nothing to rank it by
            unranked[d.kv_cache_dtype] = "emulated on this machine: its speed is not ranked"
            continue
        measured = d.capacity.measured.max_concurrency if d.capacity.measured else None
        best = (d.front.at_slo or {}).get("output_tps_per_gpu") if d.front and d.front.at_slo else None
        fixed = next((p.summary.output_throughput_tps for p in d.phases if p.kind.value == "fixed"), None)
        candidates.append((measured or 0, best or 0.0, fixed or 0.0, -order.get(d.kv_cache_dtype, 9), d.kv_cache_dtype))
    excluded = {k: v["reason"] for k, v in gates.items() if not v.get("eligible")} | unranked
    unchecked = [
        d.kv_cache_dtype for d in record.dtypes if d.kv_dtype_confirmed is None and d.server and not d.server.managed
    ]
    if len(unchecked) > 1:  # labels no server confirmed: nothing shows these are different KV dtypes
        why = f"{', '.join(unchecked)} are labels their servers did not confirm (unchecked): no recommendation"
        return {"dtype": None, "why": why, "excluded": excluded}
    if not candidates:
        return {"dtype": None, "why": "no dtype ran ok and passed the quality gate", "excluded": excluded}
    measured, tput, fixed, _, dtype = max(candidates)
    if measured:
        why = f"most concurrent requests within the SLO ({measured}), then most output tokens/s under it"
    elif tput:
        why = f"most output tokens/s under the SLO ({tput:,.0f} tokens/s)"
    elif fixed:
        why = f"most output tokens/s at the fixed load ({fixed:,.0f} tokens/s; no SLO search in this run)"
    else:
        why = "the most precise eligible dtype (nothing in this run ranks them)"
    return {"dtype": dtype, "why": why, "excluded": excluded}
