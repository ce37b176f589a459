"""What a server's logprobs must be before kvbench believes them (fidelity's and agreement's requests).

vLLM answers `prompt_logprobs` = k as one entry per prompt token, the first null, each a
{token id: {logprob, rank, decoded_token}} of the top k plus the position's own token. A server that sends
something else (NaN or +inf logprobs, a positive logprob, one token listed twice or spelled "13" and "013",
probabilities summing past 1, fewer or many more tokens than asked, a position short, a body of half a
gigabyte) would otherwise turn into a KLD of 0 ("no measurable change") or of millions of nats. Each rule
broken is a `BadAnswer` (a ValueError) with a one-line reason naming the position; the caller records it as
that dtype's and condition's problem and the run goes on.
"""

from __future__ import annotations

import json
import math
from typing import Any

LOGPROB_SLACK = 1e-4  # a logprob above 0 by float32 rounding (log_softmax of a near-certain token)
MASS_SLACK = 1e-3  # summed probabilities above 1 by the same rounding over k + 1 entries
BASE_BYTES = 1 << 20  # an answer's envelope; positions add ENTRY_BYTES per token listed
ENTRY_BYTES = 512  # one {"id": {"logprob", "rank", "decoded_token"}} entry, with a long decoded token
FULL_VOCAB_ENTRIES = 1 << 20  # entries per position a full-vocabulary answer may list (Gemma-3 has 262,144)


class BadAnswer(ValueError):
    """A server's answer that breaks what the request asked for (one line, naming where)."""


def answer_limit(positions: int, per_position: int) -> int:
    """The most bytes an honest answer to a request for `per_position` tokens at `positions` positions takes."""
    return BASE_BYTES + positions * max(1, per_position) * ENTRY_BYTES


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise BadAnswer(f"the answer lists key {key[:20]!r} twice in one object")
        seen[key] = value
    return seen


async def read_json(resp, limit: int) -> Any:
    """The body of an aiohttp response as JSON, at most `limit` bytes read, duplicate keys refused."""
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:  # stop reading: a body past what the request can need is not parsed at all
            raise BadAnswer(f"the answer is larger than {limit / 2**20:,.1f} MiB, the most this request can need")
        chunks.append(chunk)
    body = b"".join(chunks)
    try:
        return json.loads(body, object_pairs_hook=_unique_keys)
    except BadAnswer:
        raise
    except ValueError as exc:
        raise BadAnswer(f"the answer is not JSON ({str(exc)[:80]})") from None


def first_choice(doc: Any) -> dict:
    """doc["choices"][0], or a BadAnswer saying what the answer lacks."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadAnswer("the answer has no choices")
    return choices[0]


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def token_ids(value: Any, most: int, what: str = "the continuation") -> list[int]:
    """A list of at most `most` token ids (non-negative integers), as return_token_ids gives them."""
    if not isinstance(value, list):
        raise BadAnswer(f"{what} has no token_ids (got {_kind(value)}); the server must honour return_token_ids")
    if len(value) > most:
        raise BadAnswer(f"{what} has {len(value):,} tokens for max_tokens {most}")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in value):
        raise BadAnswer(f"{what} holds a token id that is not a non-negative integer")
    return list(value)


def check_logprob(lp: Any, where: str) -> float:
    """A logprob as a float: a finite number at most 0 (LOGPROB_SLACK for rounding)."""
    if isinstance(lp, bool) or not isinstance(lp, (int, float)):
        raise BadAnswer(f"{where}: the logprob is not a number (got {_kind(lp)})")
    if not math.isfinite(lp) or lp > LOGPROB_SLACK:
        raise BadAnswer(f"{where}: logprob {lp:+g} (a logprob is finite and at most 0)")
    return float(lp)


def position(row: Any, j: int, k: int, least: int) -> dict[int, float]:
    """{token id: logprob} of one prompt position, checked: distinct plain-integer ids, logprobs finite and <= 0,
    a mass of at most 1, between `least` and k + 1 tokens (k < 0: the full vocabulary, not counted)."""
    where = f"prompt_logprobs position {j}"
    if not isinstance(row, dict):
        raise BadAnswer(f"{where} is {_kind(row)}, not {{token id: {{logprob: ...}}}}")
    if k >= 0 and len(row) > k + 1:
        raise BadAnswer(f"{where} lists {len(row):,} tokens for top-{k} (at most {k + 1} with its own token)")
    if len(row) < least:
        raise BadAnswer(f"{where} lists {len(row)} tokens, fewer than the {least} asked")
    out: dict[int, float] = {}
    for t, v in row.items():
        if not (isinstance(t, str) and t.isascii() and t.isdigit() and str(int(t)) == t):
            raise BadAnswer(f"{where}: token id {str(t)[:20]!r} is not a plain integer")
        out[int(t)] = check_logprob(v.get("logprob") if isinstance(v, dict) else None, f"{where}, token {t}")
    mass = math.fsum(math.exp(lp) for lp in out.values())
    if mass > 1 + MASS_SLACK:
        raise BadAnswer(f"{where}: the listed probabilities sum to {mass:.4g}, above 1")
    return out


def positions(rows: Any, ids: list[int], first: int, k: int, least: int) -> list[dict[int, float]]:
    """Positions first..len(ids)-1 of a `prompt_logprobs` answer for the prompt `ids`, each checked (position)."""
    if not isinstance(rows, list):
        raise BadAnswer(f"prompt_logprobs is {_kind(rows)}, not one entry per prompt token ({len(ids)})")
    if len(rows) != len(ids):
        raise BadAnswer(f"prompt_logprobs has {len(rows)} positions for a {len(ids)}-token prompt")
    return [position(rows[j], j, k, least) for j in range(first, len(ids))]
