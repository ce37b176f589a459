"""Synthetic kinds: fixed, random, shared-prefix and multi-turn prompts made of drawn token ids or words."""

from __future__ import annotations

import numpy as np

from kvbench.core.errors import UsageError
from kvbench.harness.client.workload import Prompt, make_prompts
from kvbench.harness.workloads.context import _Context, _rng, _too_long
from kvbench.harness.workloads.lengths import Uniform
from kvbench.harness.workloads.plan import PlannedRequest, Session

# --- kinds ------------------------------------------------------------------------------------------


def _fixed(ctx: _Context, num_requests):
    s = ctx.spec
    n = ctx.n(num_requests)
    if ctx.mml is not None and s.prompt_tokens + s.output_tokens > ctx.mml:
        raise _too_long(ctx, "prompt_tokens + output_tokens", s.prompt_tokens + s.output_tokens)
    # Exactly today's prompts (kvbench.harness.client.workload.make_prompts), so a fixed spec changes nothing.
    prompts = make_prompts(s.to_workload(num_requests=n, api=ctx.api, seed=ctx.seed), ctx.source, stream=ctx.stream)
    reqs = []
    for i, p in enumerate(prompts):
        if ctx.api == "completions":
            ids = tuple(p.content)
        else:
            ids = tuple(ctx.chat_ids([{"role": "user", "content": p.content}]))
        reqs.append(PlannedRequest(i, p, s.output_tokens, token_ids=ids))
    if not prompts.exact:
        ctx.notes.append(prompts.note)
    return ctx.plan(reqs)


def _random(ctx: _Context, num_requests):
    s = ctx.spec
    n = ctx.n(num_requests)
    # With stream 0 this generator is numpy's default_rng(seed), and uniform lengths are drawn with the same
    # two calls as vLLM's get_sampling_params: the same lengths as `vllm bench serve --dataset-name random`.
    lengths = np.random.default_rng([int(ctx.seed), int(ctx.stream)])
    prompt_dist, special = s.prompt, 0
    if isinstance(s.prompt, Uniform) and ctx.api == "completions" and ctx.tok is not None:
        # vLLM draws the text's length without the tokens the tokenizer adds (a BOS) and the server adds them
        # back: the same draw, plus those tokens, is what its engine sees.
        special = int(ctx.tok.num_special_tokens_to_add())
        prompt_dist = s.prompt.model_copy(update={"mean": max(1, s.prompt.mean - special)})
    prompt_lens = prompt_dist.draw(lengths, n) + special
    output_lens = s.output.draw(lengths, n)
    reqs, clipped = [], 0
    for i in range(n):
        p, o, cut = ctx.fit(int(prompt_lens[i]), int(output_lens[i]))
        clipped += cut
        prompt, ids = ctx.synthetic(_rng(ctx.seed, ctx.stream, "random", i), p)
        reqs.append(PlannedRequest(i, prompt, o, token_ids=ids))
    if clipped:
        ctx.notes.append(f"{clipped} of {n} drawn lengths clipped to max_model_len {ctx.mml} (prompt shortened)")
    return ctx.plan(reqs)


def _shared_prefix(ctx: _Context, num_requests):
    s = ctx.spec
    n = ctx.n(num_requests)
    if n < s.groups:
        raise UsageError(f"workload {s.label}: {n} requests cannot cover {s.groups} groups (num_requests >= groups)")
    total = s.prefix_tokens + s.suffix_tokens
    if ctx.mml is not None and total + s.output_tokens > ctx.mml:
        raise _too_long(ctx, "prefix_tokens + suffix_tokens + output_tokens", total + s.output_tokens)
    # vLLM's prefix_repetition shape: each prefix, then its requests (n // groups each; here the remainder
    # goes one each to the first groups instead of being dropped), then one shuffle.
    per_group = [n // s.groups + (g < n % s.groups) for g in range(s.groups)]
    rows = []
    for g, count in enumerate(per_group):
        prefix = ctx.ids(_rng(ctx.seed, ctx.stream, "prefix", g), s.prefix_tokens)
        for j in range(count):
            rows.append((g, prefix + ctx.ids(_rng(ctx.seed, ctx.stream, "suffix", g, j), s.suffix_tokens)))
    order = _rng(ctx.seed, ctx.stream, "shuffle").permutation(len(rows)) if s.shuffle else range(len(rows))
    reqs = [
        PlannedRequest(
            i, Prompt(rows[k][1], total, True), s.output_tokens, prefix_group=rows[k][0], token_ids=tuple(rows[k][1])
        )
        for i, k in enumerate(order)
    ]
    return ctx.plan(reqs)


def _multi_turn(ctx: _Context, num_requests):
    """Each turn's prompt is the conversation so far plus a new user message; the assistant messages resent
    are pre-drawn replies of exactly the length each turn asked for, not what the model generated, so every
    prompt is exact in tokens. The cost: vLLM caches the blocks the model generated, which differ from the
    pre-drawn reply, so only turn k's prompt (not its reply) can hit the cache in turn k + 1 — a lower bound
    on real chat, whose resent reply can hit too."""
    s = ctx.spec
    limit = num_requests  # None: every session in full
    sessions, reqs, ended_early = [], [], 0
    sid = 0
    while (limit is None and sid < s.sessions) or (limit is not None and len(reqs) < limit):
        rng = _rng(ctx.seed, ctx.stream, "session", sid)
        turns = int(rng.integers(s.turns.min, s.turns.max + 1))
        users, replies = s.user_tokens.draw(rng, turns), s.reply_tokens.draw(rng, turns)
        thinks = s.think_time_s.draw(rng, turns)
        if limit is not None:
            turns = min(turns, limit - len(reqs))
        history_ids: list[int] = []
        messages: list[dict[str, str]] = []
        session_reqs = []
        for k in range(turns):
            u, r = int(users[k]), int(replies[k])
            if k == 0:
                u, r, cut = ctx.fit(u, r)
                if cut:
                    raise _too_long(ctx, "turn 0's user_tokens + reply_tokens", int(users[0]) + int(replies[0]))
            if ctx.api == "completions":
                prompt_ids = history_ids + ctx.ids(rng, u)
                if ctx.mml is not None and len(prompt_ids) + r > ctx.mml:
                    ended_early += 1
                    break
                prompt, ids = Prompt(prompt_ids, len(prompt_ids), True), tuple(prompt_ids)
                history_ids = prompt_ids + ctx.ids(rng, r)
            else:
                turn_messages = messages + [{"role": "user", "content": ctx.words_text(rng, u)}]
                ids = tuple(ctx.chat_ids(turn_messages))
                if ctx.mml is not None and len(ids) + r > ctx.mml:
                    ended_early += 1
                    break
                prompt = Prompt(turn_messages[-1]["content"], len(ids), True, messages=tuple(turn_messages))
                messages = turn_messages + [{"role": "assistant", "content": ctx.words_text(rng, r)}]
            req = PlannedRequest(
                len(reqs), prompt, r, session=sid, turn=k, think_s=float(thinks[k]) if k else 0.0, token_ids=ids
            )
            reqs.append(req)
            session_reqs.append(req)
        sessions.append(Session(sid, tuple(session_reqs)))
        sid += 1
        if limit is not None and sid > 100 * limit:
            break  # cannot happen while turn 0 always fits; a guard against an endless loop
    if ended_early:
        ctx.notes.append(
            f"{ended_early} of {len(sessions)} sessions ended early: their next turn would not fit "
            f"max_model_len {ctx.mml}"
        )
    return ctx.plan(reqs, sessions=tuple(sessions), max_concurrent_sessions=min(len(sessions), s.concurrent))
