"""What `build` returns: the requests to send, in order, with everything the scheduler and the record need.

A `RequestPlan` holds `PlannedRequest`s (prompt, exact output length, and per kind: prefix group, trace
hash ids and intended send time, session and turn with the think time before it), the sessions of a
multi-turn workload, notes on anything the builder had to skip or clip, and summary statistics: length
distributions (what capacity under a distribution needs) and prefix reuse (what sizing a prefix-cache
scenario needs).

Multi-turn plans must be walked by session: turn k + 1 of a session may be sent only after turn k finished,
plus its `think_s`; at most `max_concurrent_sessions` sessions at once (`walk_sessions` does exactly that).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from kvbench.harness.client.workload import Prompt, Prompts

# vLLM's default KV block size on GPUs: prefix reuse is counted in whole blocks, as vLLM's cache hits are.
DEFAULT_CACHE_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class PlannedRequest:
    """One request. `prompt.num_tokens` is its exact prompt length, `output_tokens` what it asks for
    (sent with ignore_eos, so exactly that many come back)."""

    index: int
    prompt: Prompt
    output_tokens: int
    prefix_group: int | None = None  # shared-prefix: which prefix
    hash_ids: tuple[int, ...] | None = None  # trace: the record's block hash ids
    send_at_s: float | None = None  # trace: intended send time from the start (timestamps x time_scale)
    session: int | None = None  # multi-turn: session id
    turn: int | None = None  # multi-turn: 0-based turn within the session
    think_s: float | None = None  # multi-turn: wait after the previous turn finished (0 for turn 0)
    source: int | None = None  # dataset kinds: the row/line of the file it came from (0-based)
    # The token ids the server's tokenizer sees (completions: the prompt; chat: the rendered template).
    token_ids: tuple[int, ...] | None = field(default=None, repr=False, compare=False)

    @property
    def prompt_tokens(self) -> int | None:
        return self.prompt.num_tokens


@dataclass(frozen=True)
class Session:
    """A multi-turn conversation: its turns in order; turn k's prompt is a prefix of turn k + 1's."""

    id: int
    turns: tuple[PlannedRequest, ...]


@dataclass(frozen=True)
class RequestPlan:
    spec: Any
    api: str
    seed: int
    stream: int
    max_model_len: int | None
    requests: tuple[PlannedRequest, ...]
    sessions: tuple[Session, ...] = ()
    max_concurrent_sessions: int | None = None
    notes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def prompts(self) -> Prompts:
        """The prompts in plan order, as today's `run_load` takes them."""
        note = "; ".join(self.notes) or f"{self.spec.kind} workload ({self.spec.label})"
        return Prompts([r.prompt for r in self.requests], self.api, note)

    @property
    def output_tokens(self) -> list[int]:
        return [r.output_tokens for r in self.requests]

    @property
    def exact(self) -> bool:
        return all(r.prompt.exact for r in self.requests)

    @property
    def timed(self) -> bool:
        """True when requests carry intended send times (trace replay)."""
        return any(r.send_at_s is not None for r in self.requests)

    @cached_property
    def stats(self) -> dict[str, Any]:
        """Length distributions and totals, plus prefix reuse at vLLM's default block size."""
        prompt = np.array([r.prompt.num_tokens or 0 for r in self.requests], dtype=np.int64)
        output = np.array([r.output_tokens for r in self.requests], dtype=np.int64)
        out = {
            "requests": len(self.requests),
            "prompt_tokens": distribution(prompt),
            "output_tokens": distribution(output),
            # What the KV cache holds for a request when it finishes: capacity under this distribution.
            "sequence_tokens": distribution(prompt + output),
            "total_prompt_tokens": int(prompt.sum()),
            "total_output_tokens": int(output.sum()),
            "total_tokens": int(prompt.sum() + output.sum()),
            "distinct_prompts": len({_key(r) for r in self.requests}),
        }
        if self.sessions:
            out["sessions"] = len(self.sessions)
            out["max_concurrent_sessions"] = self.max_concurrent_sessions
        if self.timed:
            out["duration_s"] = max(r.send_at_s for r in self.requests)
        out["prefix"] = self.prefix_reuse(DEFAULT_CACHE_BLOCK_TOKENS)
        return out

    def prefix_reuse(self, block_tokens: int = DEFAULT_CACHE_BLOCK_TOKENS) -> dict[str, Any] | None:
        """Prefix sharing as vLLM's prefix cache sees it: whole blocks of `block_tokens`, chained (a block is
        reusable only after the same blocks before it), requests in plan order, an unbounded cache.

        distinct_prefixes: maximal block chains that two or more requests share (shared-prefix: its groups;
            multi-turn: one per session with 2+ turns).
        shared_tokens: tokens in blocks two or more requests share: the working set a cache must hold.
        reusable_tokens: prompt tokens whose block an earlier request already computed (an upper bound on
            prefix-cache hits, in tokens); ideal_hit_rate = reusable_tokens / prompt tokens.
        None when a prompt's token ids are unknown.
        """
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        counts: Counter[int] = Counter()
        parent: dict[int, int | None] = {}
        seen: set[int] = set()
        reusable = total = 0
        for r in self.requests:
            ids = r.token_ids
            if ids is None:
                return None
            total += len(ids)
            chain, h, hit = [], None, True
            for i in range(len(ids) // block_tokens):
                prev, h = h, hash((h, ids[i * block_tokens : (i + 1) * block_tokens]))
                parent.setdefault(h, prev)
                chain.append(h)
                if hit and h in seen:
                    reusable += block_tokens
                else:
                    hit = False
            counts.update(set(chain))
            seen.update(chain)
        shared = {h for h, c in counts.items() if c >= 2}
        inner = {parent[h] for h in shared if parent[h] in shared}
        return {
            "block_tokens": block_tokens,
            "distinct_prefixes": len(shared - inner),
            "shared_tokens": len(shared) * block_tokens,
            "reusable_tokens": reusable,
            "ideal_hit_rate": reusable / total if total else 0.0,
        }

    def describe(self) -> dict[str, Any]:
        """For a run record: the spec, how it was built, and the statistics (JSON-ready)."""
        return {
            "workload": self.spec.describe(),
            "api": self.api,
            "seed": self.seed,
            "stream": self.stream,
            "max_model_len": self.max_model_len,
            "lengths_exact": self.exact,
            "notes": list(self.notes),
            "stats": self.stats,
        }


def distribution(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "min": 0, "max": 0}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "min": int(values.min()),
        "max": int(values.max()),
    }


def _key(r: PlannedRequest):
    c, m = r.prompt.content, r.prompt.messages
    return (tuple(c) if isinstance(c, list) else c, tuple((x["role"], x["content"]) for x in m) if m else None)


async def walk_sessions(plan: RequestPlan, send: Callable[[PlannedRequest], Awaitable[Any]]) -> None:
    """Send a multi-turn plan: each session's turns in order, each after the previous one finished plus its
    think time, at most `max_concurrent_sessions` sessions at once (a new session starts when one ends).

    A reference for the scheduler (and what the tests hold it to); `send` awaits one request to its end.
    """
    if not plan.sessions:
        raise ValueError("walk_sessions needs a multi-turn plan")
    slots = asyncio.Semaphore(plan.max_concurrent_sessions or len(plan.sessions))

    async def one(session: Session) -> None:
        async with slots:
            for r in session.turns:
                if r.think_s:
                    await asyncio.sleep(r.think_s)
                await send(r)

    await asyncio.gather(*(one(s) for s in plan.sessions))
