"""The fake server's whole (non-streamed) answers: what lm-eval and kvbench's agreement and canary requests get.

FakeConfig.answers chooses them: " tok" x max_tokens, or kvbench's retrieval prompts answered with the asked
key; the corrupt_* settings make it wrong under the field's failure modes (under load, beside a prefill, on a
prefix-cache hit) and degenerate_every makes every k-th answer empty.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from aiohttp import web

from kvbench.testing.fakehostile import damaged
from kvbench.testing.fakestate import Call, FakeConfig

_NEEDLE = re.compile(r"The pass key (?:of (\S+) )?is (\d+)\.")
_QUESTION = re.compile(r"The pass key (?:of (\S+) )?is$")


def passkey_answer(prompt: str) -> str | None:
    """The key a kvbench retrieval prompt asks for (None for any other prompt)."""
    asked = _QUESTION.search(prompt.rstrip())
    if not asked:
        return None
    for name, key in _NEEDLE.findall(prompt):
        if (name or None) == asked.group(1):
            return key
    return None


def _answer(cfg: FakeConfig, prompt: str, max_tokens: int, corrupt: bool, n: int = 1) -> tuple[str, str]:
    """(text, finish_reason) of a non-streamed completion (the n-th request)."""
    if cfg.answers == "passkey":
        key = passkey_answer(prompt)
        if key is not None and cfg.degenerate_every and n % cfg.degenerate_every == 0:
            return "", "stop"
        if key is not None:
            if corrupt:  # every digit shifted: wrong, and the same wrong answer every time
                key = "".join(str((int(d) + 1) % 10) for d in key)
            return " " + key, "stop"
    return " tok" * max_tokens, "length"


def _position(before: int, token: int, k: int, corrupt: bool) -> dict[str, dict]:
    """One prompt position in vLLM's `prompt_logprobs` shape ({token id: {logprob, rank, decoded_token}}): the
    top k of a fixed distribution keyed by the token before (tail mass 1 - e^-1 / (1 - e^-0.5) = 6.5%) plus the
    position's own token; `corrupt` swaps the top two (the top token changes, KL > 0)."""
    ids = [(before * 7 + 13 * i) % 1000 for i in range(max(k, 2))]
    lps = [-1.0 - 0.5 * i for i in range(len(ids))]
    if corrupt:
        lps[0], lps[1] = lps[1], lps[0]
    ranked = sorted(zip(ids, lps, strict=True), key=lambda x: -x[1])
    out = {str(t): {"logprob": lp, "rank": r + 1, "decoded_token": f" t{t}"} for r, (t, lp) in enumerate(ranked[:k])}
    if str(token) not in out:
        lp = dict(ranked).get(token, -9.0)
        out[str(token)] = {"logprob": lp, "rank": 1 + sum(x[1] > lp for x in ranked), "decoded_token": f" t{token}"}
    return out


def _token_completion(body: dict[str, Any], max_tokens: int, corrupt: bool, n: int) -> dict[str, Any]:
    """A token-id prompt (kvbench's agreement and canary requests) answered greedily and deterministically: the
    continuation's ids follow from the prompt's (shifted when `corrupt`), with vLLM's `logprobs` shape
    (`token_id:<n>` with return_tokens_as_token_ids) and, when asked, `prompt_logprobs`."""
    prompt = [int(t) for t in body["prompt"]]
    base = sum(prompt) % 997 + (1 if corrupt else 0)
    ids = [(base + 7 * i) % 1000 for i in range(max_tokens)]
    choice: dict[str, Any] = {"index": 0, "text": " tok" * len(ids), "finish_reason": "length", "logprobs": None}
    if body.get("logprobs") is not None:
        choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids)}
    if body.get("prompt_logprobs") is not None:
        k = int(body["prompt_logprobs"])
        choice["prompt_logprobs"] = [None] + [
            _position(prompt[j - 1], prompt[j], k, corrupt) for j in range(1, len(prompt))
        ]
    if body.get("return_token_ids"):
        choice["token_ids"] = ids
    return {
        "id": f"cmpl-fake-{n}",
        "object": "text_completion",
        "model": body.get("model"),
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)},
    }


async def complete_whole(call: Call) -> web.Response:
    """A non-streamed response after ttft_s + itl_s per further token; a list of prompts gets one choice each.
    hang_every / drop_every apply as to streams (a hung request never answers; a dropped one is cut off)."""
    request, st, cfg, body, chat, n, entry = call.request, call.st, call.cfg, call.body, call.chat, call.n, call.entry
    if cfg.hang_every and n % cfg.hang_every == 0:
        entry["outcome"] = "hang"
        await st.stopping.wait()
        raise web.HTTPServiceUnavailable()
    if cfg.drop_every and n % cfg.drop_every == 0:
        entry["outcome"] = "dropped"
        request.transport.close()
        raise web.HTTPServiceUnavailable()
    max_tokens = call.max_tokens
    corrupt = bool(cfg.corrupt_above and st.running >= cfg.corrupt_above)  # this request makes it one more
    corrupt |= bool(cfg.corrupt_beside_prefill and st.prefilling)
    ids_prompt = not chat and isinstance(body.get("prompt"), list) and all(isinstance(t, int) for t in body["prompt"])
    text = body.get("prompt") if not chat and isinstance(body.get("prompt"), str) else None
    if text is not None and max_tokens == 1:
        st.last_prefix = text
    elif text is not None and st.last_prefix and len(text) > len(st.last_prefix) and text.startswith(st.last_prefix):
        corrupt = corrupt or cfg.corrupt_cached  # it extends the cached prefix (used once: a tiny cache)
        st.last_prefix = None
    entry["in_flight_at_arrival"] = st.running
    entry["corrupted"] = corrupt
    st.running += 1
    try:
        delay = call.t_recv + cfg.ttft_s + max(0, max_tokens - 1) * cfg.itl_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    finally:
        st.running -= 1
    if ids_prompt:
        return damaged(cfg, request, body, _token_completion(body, max_tokens, corrupt, n))
    if chat:
        prompts = [" ".join(str(m.get("content", "")) for m in body.get("messages", []))]
    else:
        raw = body.get("prompt", "")
        prompts = raw if isinstance(raw, list) and all(isinstance(p, str) for p in raw) else [raw]
    choices, completion_tokens = [], 0
    for i, prompt in enumerate(prompts):
        text, finish = _answer(cfg, prompt if isinstance(prompt, str) else "", max_tokens, corrupt, n)
        completion_tokens += len(text.split())
        choices.append(
            {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            if chat
            else {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
        )
    prompt_tokens = call.prompt_tokens
    st.prompt_tokens_total += prompt_tokens
    st.generation_tokens_total += completion_tokens
    st.success_total += 1
    entry["writes_s"].append(time.perf_counter())
    return web.json_response(
        {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-fake-{n}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": cfg.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )
