"""The ways quantized KV caches have failed in the field, as evaluation conditions of a run's eval phase.

Reports from 2026 (NVFP4 and FP8 KV caches on vLLM and SGLang) share a shape: HTTP 200, fluent text, wrong
answers, and only under some serving condition. Each is a condition here, evaluated on the same items as at
rest and compared item by item with the same dtype at rest and with auto in the same condition
(kvbench.analysis.verdict_accuracy):

- `batched`: at least BATCHED_MIN requests in flight (or the SLO concurrency, whichever is larger); run only
  where that differs from the `load` condition. Garbage under batching: GSM8K 0.75 one at a time, 0.005 at
  32 concurrent.
- `mixed`: a few items at a time while long prompts keep arriving (prefill-only requests that fill the
  context), so every engine step mixes prefill chunks with the items' decodes.
- `prefix`: each item after an earlier request cached the first PREFIX_SHARE of its tokens (blocks of a long
  cached KV extended by the item's tail: the prefix-cache-extend reports). kvbench's own client sends the pair,
  one item at a time, with the request lm-eval sends for the item; the condition records vLLM's prefix-cache
  hits over it, and is skipped for tasks whose items kvbench cannot rebuild (lm-eval's own).
- degenerate outputs in any condition (empty, one token repeated, the tokenizer's id-0 token): counted per
  condition and, where a dtype has more than auto in the same condition (Fisher's exact test, one-sided),
  a finding of their own.

Settings (how many in flight, how long the background prompts, the prefix share) are `[failure_modes]` in
kvbench/data/run_defaults.toml.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvbench.core.datafiles import load_toml
from kvbench.harness.client.workload import Workload, make_prompts
from kvbench.harness.quality.evaluation import EvalResult, ItemResult, TaskResult
from kvbench.records.findings import DEGENERATE_KINDS
from kvbench.specs import evaltasks

SETTINGS = load_toml("run_defaults.toml")["failure_modes"]
BATCHED_MIN: int = SETTINGS["batched_min"]
PREFIX_SHARE: float = SETTINGS["prefix_share"]


def batched_concurrency(at_load: int) -> int | None:
    """In-flight requests of the `batched` condition, or None where the `load` condition already has them."""
    c = max(BATCHED_MIN, at_load)
    return None if c == at_load else c


@dataclass(frozen=True)
class Traffic:
    """Background requests beside an evaluation: `prompts(chunk, n)` and their lengths in tokens."""

    prompts: Callable[[int, int], Sequence]
    prompt_tokens: int
    output_tokens: int


def background_prompts(tokenizer, max_model_len: int, stream: int) -> Traffic:
    """The `mixed` condition's background: prompts that fill the context, one token out (prefill only)."""
    length = max(16, max_model_len - SETTINGS["background_room_tokens"])

    def prompts(chunk: int, n: int):
        w = Workload(prompt_tokens=length, output_tokens=1, num_requests=n)
        return make_prompts(w, tokenizer, stream=stream + chunk)

    return Traffic(prompts, length, 1)


def degenerate(response: str | None, id0_text: str | None) -> str | None:
    """The way an answer is degenerate ("empty", "repeated", "id-0"), or None for an ordinary answer."""
    text = (response or "").strip()
    if not text:
        return "empty"
    if id0_text and id0_text in text:
        return "id-0"
    words = text.split()
    if len(text) >= 4 and (len(set(text)) == 1 or (len(words) >= 3 and len(set(words)) == 1)):
        return "repeated"
    return None


def degenerate_counts(result: EvalResult, id0_text: str | None) -> dict:
    """{"n", "degenerate", "empty", "repeated", "id-0"} over every item of one condition's evaluation."""
    kinds = Counter(degenerate(i.response, id0_text) for tr in result.tasks.values() for i in tr.items)
    n = sum(kinds.values())
    return {"n": n, "degenerate": n - kinds[None], **{k: kinds[k] for k in DEGENERATE_KINDS}}


# -- the prefix condition's client -------------------------------------------------------------------------------


async def prefix_condition(
    base_url: str,
    model: str,
    tokenizer,
    tasks: list[str],
    limit: int | None,
    headers: dict[str, str] | None,
    timeout_s: float,
) -> EvalResult:
    """Each item of kvbench's own tasks, one at a time: first its first PREFIX_SHARE (prefix_text, 1 token out, so
    vLLM caches its blocks), then the item itself as lm-eval sends it (text, greedy, its stop strings and answer
    room), scored as lm-eval scores it (exact match of the stripped answer)."""
    import aiohttp  # here: the verdict (report, dashboard, claims) imports this module for its definitions

    out: dict[str, TaskResult] = {}
    t0 = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers or {}) as session:
        post = lambda prompt, n, stop=(): _complete(session, base_url, model, prompt, n, stop)  # noqa: E731
        for task in tasks:
            results = []
            for item in evaltasks.generate(task, tokenizer, limit or evaltasks.DEFAULT_ITEMS):
                await post(prefix_text(item.prompt), 1)
                room = evaltasks.MAX_GEN_TOKS[evaltasks.parse_task(task)[0]]
                results.append(_item(item, await post(item.prompt, room, evaltasks.STOP)))
            acc = sum(r.score for r in results) / len(results) if results else 0.0
            out[task] = TaskResult(task, "exact_match,exact", acc, len(results), results)
    return EvalResult(out, base_url, model, 1, limit, "kvbench prefix client", time.monotonic() - t0)


def prefix_text(prompt: str, share: float = PREFIX_SHARE) -> str:
    """The prompt's first `share` (of its characters), cut at the end of a word: a tokenizer that splits words
    at spaces (BPE on byte-level pre-tokens, as Llama's and kvbench's tiny model's do) encodes it as the prompt's
    own first tokens, so the prompt that follows finds its blocks in vLLM's prefix cache."""
    cut = int(len(prompt) * share)
    while cut > 0 and not (prompt[cut] == " " and not prompt[cut - 1].isspace()):
        cut -= 1
    return prompt[:cut] if cut > 0 else prompt[: max(1, int(len(prompt) * share))]


def _item(item, response: str) -> ItemResult:
    """An answer scored as lm-eval scores the task (remove_whitespace, take_first, exact match)."""
    return ItemResult(
        doc_id=item.doc_id,
        prompt_sha256=hashlib.sha256(item.prompt.encode()).hexdigest(),
        target=item.answer,
        response=response,
        filtered=response.lstrip(),
        score=float(evaltasks.score(response, item.answer)),
    )


async def _complete(session, base_url: str, model: str, prompt, max_tokens: int, stop) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    if stop:
        body["stop"] = list(stop)
    async with session.post(f"{base_url}/v1/completions", json=body, allow_redirects=False) as resp:
        if resp.status != 200:
            text = (await resp.text())[:200]
            raise RuntimeError(f"prefix condition: HTTP {resp.status} from the server: {text}")
        return (await resp.json())["choices"][0]["text"]


def own_tasks(tasks: list[str]) -> list[str]:
    """The tasks whose items kvbench rebuilds (its bundled ones): the prefix condition's."""
    return [t for t in tasks if t.startswith(evaltasks.PREFIX)]
