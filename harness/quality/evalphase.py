"""One dtype's eval phase inside a run: task accuracy in every condition, each kept item by item.

lm-evaluation-harness (kvbench.harness.quality.underload, in its worker process) runs the tasks at rest (1 request at a
time), at load (the run's serving concurrency), batched (at least 32 in flight), mixed (a few at a time beside
long prefills) and during load (1 at a time while the fixed load's traffic runs); kvbench's own client runs
the prefix-cache condition (kvbench.harness.quality.failuremodes). A failure (an engine that dies mid-eval) is recorded
in the dtype's `eval`, not raised: the load phases that follow find out for themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvbench.core import sequential as seq
from kvbench.core.errors import one_line
from kvbench.harness.client.metrics import summarize
from kvbench.harness.client.scheduler import Concurrency, sustain_load
from kvbench.harness.quality import failuremodes, untildecided
from kvbench.harness.quality import underload as quality
from kvbench.harness.server.promscrape import fetch_metrics

EVAL_LOAD_STREAM, MIXED_STREAM = 40_000, 60_000  # prompt seed streams of the background traffic


@dataclass
class EvalPhase:
    """What the phase needs from the run: the plan, the dtype's server and where results go."""

    plan: object  # kvbench.harness.run.runplan.RunPlan
    dtype: str
    backend: object  # an open kvbench.harness.client.backend.OpenAIBackend
    headers: dict
    evaluator: quality.Evaluator
    reporter: object  # kvbench.harness.run.runplan.Reporter
    samples: object  # kvbench.records.SampleStore
    items: dict  # (dtype, condition) -> {task: {doc id: score}}, for the paired comparisons
    tokenizer: object  # the loaded tokenizer (for the prefix client and the background prompts)
    tokenizer_dir: str
    max_len: int | None
    id0_text: str | None  # what the tokenizer's token id 0 decodes to (a degenerate answer's mark)

    async def run(self, evals: dict, at_load: int, load, prompts: Callable[[int, int], list]) -> None:
        """Fill `evals` (the dtype's `eval`): {condition: summary}, and "error" when one failed."""
        fm = failuremodes.SETTINGS
        wanted = getattr(self.plan, "eval_conditions", None)  # None: every condition
        wants = lambda condition: wanted is None or condition in wanted
        try:
            await self._rest(evals)
            if wants("load"):
                await self._lm_eval(evals, "load", max(1, at_load))
            batched = failuremodes.batched_concurrency(max(1, at_load)) if wants("batched") else None
            if batched:
                await self._lm_eval(evals, "batched", batched, limit=fm["items"])
            if wants("mixed"):
                background = failuremodes.background_prompts(self.tokenizer, self.max_len or 512, MIXED_STREAM)
                mode = Concurrency(fm["background_concurrency"])
                await self._beside(evals, "mixed", fm["mixed_concurrency"], background, mode, fm["items"])
            if wants("prefix"):
                await self._prefix(evals, fm["items"])
            if load is not None and wants("during_load"):
                w = self.plan.workload
                traffic = failuremodes.Traffic(
                    lambda k, n: prompts(EVAL_LOAD_STREAM + k, n), w.prompt_tokens, w.output_tokens
                )
                await self._beside(evals, "during_load", 1, traffic, load, None)
        except Exception as exc:  # lm-eval's own errors, a server gone mid-eval
            evals["error"] = one_line(exc)

    def _limit(self, cap: int | None) -> int | None:
        limits = [x for x in (self.plan.eval_limit, cap) if x]
        return min(limits) if limits else None

    def _job(self, concurrency: int, limit: int | None) -> quality.EvalJob:
        plan = self.plan
        return quality.EvalJob(
            self.backend.base_url,
            self.backend.model,
            self.tokenizer_dir,
            tuple(plan.eval_tasks),
            concurrency,
            limit,
            self.headers or None,
            self.max_len,
            plan.stall_timeout_s,
            plan.client_realtime,
        )

    def _keep(self, evals: dict, condition: str, concurrency: int, res, stage=None) -> None:
        """The condition's summary and items from `res` (all its items so far); `stage` (default `res`): the
        items this evaluation added, into the evals Parquet."""
        evals[condition] = quality.condition_summary(res, concurrency)
        evals[condition]["degenerate"] = failuremodes.degenerate_counts(res, self.id0_text)
        self.items[(self.dtype, condition)] = quality.items_by_task(res)
        self.samples.add_eval(self.dtype, condition, concurrency, res if stage is None else stage)

    def _looks(self) -> list[int]:
        """Items per task at each planned look at rest (kvbench.harness.quality.untildecided); one look for lm-eval's
        own tasks, whose size is fixed."""
        tasks = self.plan.eval_tasks
        if failuremodes.own_tasks(tasks) != list(tasks):
            return []
        return seq.plan(self.plan.eval_limit, getattr(self.plan, "max_eval_items", None))

    async def _rest(self, evals: dict) -> None:
        """At rest: auto answers every planned look's items; another dtype takes looks while undecided."""
        looks = self._looks()
        if len(looks) < 2:
            return await self._lm_eval(evals, "rest", 1)
        reference = self.dtype == quality.REFERENCE
        tasks = ", ".join(self.plan.eval_tasks)
        first = looks[-1] if reference else looks[0]
        self.reporter.phase(self.dtype, f"eval rest ({tasks}, concurrency 1, {first} items each)")
        res = await self.evaluator.run(self._job(1, first))
        self._keep(evals, "rest", 1, res)
        if not reference and (quality.REFERENCE, "rest") in self.items:
            await self._until_decided(evals, res, looks)

    async def _until_decided(self, evals: dict, res, looks: list[int]) -> None:
        ref, ntasks = self.items[(quality.REFERENCE, "rest")], len(self.plan.eval_tasks)
        counts = [untildecided.pooled_counts(ref, self.items[(self.dtype, "rest")], looks[0])]
        taken, stopped = untildecided.judge(counts, looks, ntasks, self.plan)
        while taken[-1].decision == "continue":
            k = len(counts)
            self.reporter.phase(
                self.dtype,
                f"eval rest, look {k + 1} of {len(looks)}: items {looks[k - 1]}-{looks[k]} of each task "
                f"(pooled comparison undecided at {taken[-1].items:,} items)",
            )
            stage = await self.evaluator.run(replace(self._job(1, None), docs=(looks[k - 1], looks[k])))
            res = untildecided.merge(res, stage)
            self._keep(evals, "rest", 1, res, stage)
            counts.append(untildecided.pooled_counts(ref, self.items[(self.dtype, "rest")], looks[k]))
            taken, stopped = untildecided.judge(counts, looks, ntasks, self.plan)
        evals["rest"]["sequential"] = untildecided.record(looks, ntasks, taken, stopped, self.plan)

    async def _lm_eval(self, evals: dict, condition: str, concurrency: int, limit: int | None = None) -> None:
        tasks = ", ".join(self.plan.eval_tasks)
        self.reporter.phase(self.dtype, f"eval {condition.replace('_', ' ')} ({tasks}, concurrency {concurrency})")
        res = await self.evaluator.run(self._job(concurrency, self._limit(limit)))
        self._keep(evals, condition, concurrency, res)

    async def _beside(self, evals, condition, concurrency, traffic, mode, limit) -> None:
        """lm-eval while `mode`'s traffic runs, for as long as the evaluation takes. traffic: a
        failuremodes.Traffic (prompts(chunk, n), their prompt and output lengths)."""
        plan = self.plan
        flowing = asyncio.Event()
        background = asyncio.ensure_future(
            sustain_load(
                self.backend,
                traffic.prompts,
                traffic.output_tokens,
                mode,
                stall_timeout_s=plan.stall_timeout_s,
                realtime=plan.client_realtime,
                flowing=flowing,
            )
        )
        try:
            # the items go out once the traffic is there (a first request back), never before it
            waiter = asyncio.ensure_future(flowing.wait())
            await asyncio.wait([waiter, background], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            await self._lm_eval(evals, condition, concurrency, limit)
        finally:
            background.cancel()
            sent = await background
        s = summarize(sent, None)
        evals[condition]["traffic"] = {
            "mode": mode.describe(),
            "prompt_tokens": traffic.prompt_tokens,
            "output_tokens": traffic.output_tokens,
            "completed": s.completed,
            "failed": s.failed,
            "failure_reasons": s.failure_reasons,
            "ttft_p95_ms": s.ttft_ms.get("p95"),
            "tpot_p95_ms": s.tpot_ms.get("p95"),
        }

    async def _prefix(self, evals: dict, limit: int) -> None:
        tasks = failuremodes.own_tasks(self.plan.eval_tasks)
        if not tasks:  # lm-eval's own tasks: kvbench cannot rebuild their items to split them
            return
        self.reporter.phase(self.dtype, f"eval prefix ({', '.join(tasks)}, each item after its cached prefix)")
        before = await self._hits()
        res = await failuremodes.prefix_condition(
            self.backend.base_url,
            self.backend.model,
            self.tokenizer,
            tasks,
            self._limit(limit),
            self.headers,
            self.plan.stall_timeout_s,
        )
        self._keep(evals, "prefix", 1, res)
        after = await self._hits()
        evals["prefix"]["prefix_share"] = failuremodes.PREFIX_SHARE
        evals["prefix"]["hit_tokens"] = after - before if after is not None and before is not None else None

    async def _hits(self) -> float | None:
        try:
            snap = await asyncio.to_thread(fetch_metrics, self.backend.base_url, 5.0, self.headers)
        except Exception:  # a server without /metrics: the condition still runs, its hits unknown
            return None
        return snap.values.get("prefix_cache_hits")
