"""End-to-end accuracy through the real server: does a quantized KV cache change what the model says?

For a fixed set of prompts every dtype's server decodes greedily (temperature 0) and returns each chosen
token's logprob. Against the `auto` (16-bit) server:
  * greedy-token agreement: the share of positions where the quantized run chose the same token, and the
    share of whole sequences that came out identical (with the mean position of the first difference);
  * logprob delta, teacher-forced: the quantized server scores auto's own continuation (prompt_logprobs
    over prompt + auto's tokens), so both logprobs refer to the same tokens in the same context; the mean
    and max |delta| over those tokens. Free-running logprobs are not compared: after the first differing
    token the contexts differ and the comparison means nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass

import aiohttp

from kvbench.harness.client import http
from kvbench.harness.client.http import side_session
from kvbench.harness.quality import logprobs


@dataclass
class Sample:
    prompt: list[int]
    tokens: list[int]  # the greedy continuation
    logprobs: list[float]  # of each chosen token, as the serving model computed it


def _token_id(text: str) -> int:
    # With return_tokens_as_token_ids vLLM names tokens "token_id:<n>".
    head, sep, number = text.rpartition(":")
    if not sep or not number.isascii() or not number.isdigit():
        raise logprobs.BadAnswer(f"a greedy token is named {text[:30]!r}, not token_id:<n>")
    return int(number)


async def greedy(
    session: aiohttp.ClientSession, base_url: str, model: str, prompt: list[int], max_tokens: int
) -> Sample:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }
    async with session.post(f"{base_url}/v1/completions", json=body, allow_redirects=False) as resp:
        await http.raise_for_status(resp)
        choice = logprobs.first_choice(await logprobs.read_json(resp, logprobs.answer_limit(max_tokens, 2)))
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not all(isinstance(lp.get(k), list) for k in ("tokens", "token_logprobs")):
        raise logprobs.BadAnswer("the answer has no logprobs {tokens, token_logprobs}")
    tokens = logprobs.token_ids([_token_id(str(t)) for t in lp["tokens"]], max_tokens, "the greedy answer")
    if len(lp["token_logprobs"]) != len(tokens):
        raise logprobs.BadAnswer(f"{len(tokens)} tokens but {len(lp['token_logprobs'])} logprobs")
    return Sample(prompt, tokens, [logprobs.check_logprob(x, "the greedy answer") for x in lp["token_logprobs"]])


async def score(
    session: aiohttp.ClientSession, base_url: str, model: str, prompt: list[int], continuation: list[int]
) -> list[float]:
    """Logprobs this server assigns to `continuation` after `prompt` (teacher forcing)."""
    ids = prompt + continuation
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1}
    async with session.post(f"{base_url}/v1/completions", json=body, allow_redirects=False) as resp:
        await http.raise_for_status(resp)
        choice = logprobs.first_choice(await logprobs.read_json(resp, logprobs.answer_limit(len(ids), 2)))
    # the shape checked (a list of len(ids) positions, each {token id: {logprob}}): a ValueError, never an
    # IndexError or TypeError that would fail the dtype (K-B19)
    rows = logprobs.positions(choice.get("prompt_logprobs"), ids, len(prompt), 1, 1)
    out = []
    for pos, (dist, token) in enumerate(zip(rows, continuation, strict=True), start=len(prompt)):
        if token not in dist:
            raise logprobs.BadAnswer(f"prompt_logprobs position {pos} does not list its own token {token}")
        out.append(dist[token])
    return out


async def collect(
    base_url: str,
    model: str,
    prompts: list[list[int]],
    max_tokens: int,
    reference: list[Sample] | None,
    stall_timeout_s: float = 60.0,
    headers: dict[str, str] | None = None,
) -> dict:
    """Greedy samples from this server, and its teacher-forced scores of the reference's continuations.

    A request that gets no byte for `stall_timeout_s` fails (a hung server must not hang the run)."""
    async with side_session(headers, stall_timeout_s) as session:
        samples = [await greedy(session, base_url, model, p, max_tokens) for p in prompts]
        forced = None
        if reference is not None:
            forced = [await score(session, base_url, model, r.prompt, r.tokens) for r in reference]
    return {"samples": [asdict(s) for s in samples], "teacher_forced": forced}


def compare(reference: list[dict], samples: list[dict], teacher_forced: list[list[float]] | None) -> dict:
    """Agreement of one dtype's outputs with the reference (auto) outputs on the same prompts."""
    positions = same = identical = 0
    first_diffs = []
    for ref, got in zip(reference, samples, strict=True):
        pairs = list(zip(ref["tokens"], got["tokens"], strict=False))
        matches = [a == b for a, b in pairs]
        positions += len(pairs)
        same += sum(matches)
        if all(matches):
            identical += 1
        else:
            first_diffs.append(matches.index(False))
    out = {
        "sequences": len(samples),
        "tokens": positions,
        "token_agreement": same / positions if positions else None,
        "identical_sequences": identical,
        "mean_first_difference": sum(first_diffs) / len(first_diffs) if first_diffs else None,
        "logprob_delta_mean": None,
        "logprob_delta_max": None,
    }
    if teacher_forced is not None:
        deltas = [
            abs(a - b)
            for ref, forced in zip(reference, teacher_forced, strict=True)
            for a, b in zip(ref["logprobs"], forced, strict=False)
        ]
        if deltas:
            out["logprob_delta_mean"] = sum(deltas) / len(deltas)
            out["logprob_delta_max"] = max(deltas)
    return out


class Canaries:
    """Requests with known greedy outputs, recorded at rest, that ride inside every load phase: a dtype that
    corrupts outputs only under batching (correct alone, wrong at 32 concurrent requests) is caught even when
    no evaluation was asked for. Each load phase sends every canary once, after the load has ramped up, and
    compares the greedy tokens with the at-rest ones (the same dtype's server, so any difference is load)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        samples: list[dict],
        headers: dict[str, str] | None = None,
        timeout_s: float = 60.0,
    ):
        self.base_url, self.model, self.samples, self.headers, self.timeout_s = (
            base_url,
            model,
            samples,
            headers,
            timeout_s,
        )

    async def ride(self, delay_s: float = 0.5) -> dict:
        """Send every canary once (after `delay_s`, so they meet the load) and say which came back different."""
        await asyncio.sleep(delay_s)
        out = {"sent": 0, "same": 0, "differ": 0, "failed": 0, "first_difference": []}
        async with side_session(self.headers, self.timeout_s) as session:
            got = await asyncio.gather(
                *(greedy(session, self.base_url, self.model, s["prompt"], len(s["tokens"])) for s in self.samples),
                return_exceptions=True,
            )
        for ref, sample in zip(self.samples, got, strict=False):
            out["sent"] += 1
            if isinstance(sample, BaseException):
                out["failed"] += 1
                continue
            pairs = list(zip(ref["tokens"], sample.tokens, strict=False))
            if all(a == b for a, b in pairs) and len(sample.tokens) == len(ref["tokens"]):
                out["same"] += 1
            else:
                out["differ"] += 1
                out["first_difference"].append(next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs)))
        return out
