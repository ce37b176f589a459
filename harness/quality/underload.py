"""Quality under load inside a run: task accuracy per dtype and condition, paired with auto's.

Each dtype's server is evaluated (kvbench.harness.quality.evaluation: lm-evaluation-harness, temperature 0, every item
kept) in three conditions: at rest (one request at a time), at load (the run's serving concurrency: the
SLO-measured knee, else the fixed load) and during load (one request at a time while the fixed load's traffic
runs). lm-eval runs in a separate process, so its Python work never stalls the load generator's clock.

Each task's summary keeps a fingerprint of its item-by-item scores (`scores_sha256`), so a reader of the
record alone can tell conditions with identical answers apart from ones that merely score the same. What the
numbers decide (non-inferiority against the budget) is kvbench/analysis/verdict_accuracy.py's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
from dataclasses import dataclass

from kvbench.harness.quality.evalrecord import _accuracy, _binary, _paired
from kvbench.records import conditions
from kvbench.records.blocks import fingerprint

REFERENCE = "auto"


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
    docs: tuple[int, int] | None = None  # items [start, stop) of each task instead of the first `limit`


def _evaluate(job: EvalJob):
    import os

    os.environ.setdefault("TQDM_DISABLE", "1")  # lm-eval's progress bars would interleave with the run's own
    from kvbench.harness.client.clientsched import Realtime
    from kvbench.harness.quality.evaluation import evaluate

    with Realtime() if job.realtime else contextlib.nullcontext():
        return evaluate(
            job.base_url,
            job.served_model,
            job.tokenizer,
            list(job.tasks),
            num_concurrent=job.num_concurrent,
            limit=job.docs or job.limit,
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
    """{task: {metric, n, correct, accuracy, ci95, scores_sha256}} of one evaluation."""
    tasks = {}
    for name, tr in result.tasks.items():
        scores = tr.scores
        items = {i.doc_id: i.score for i in tr.items}
        entry = {"metric": tr.metric, **_accuracy(scores), "scores_sha256": fingerprint(items)}
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
