"""What is sent: the workload shape and reproducible, exact-length prompts.

Completions prompts are lists of token ids (the OpenAI completions API accepts `prompt` as a list of ints),
so the server sees exactly `prompt_tokens` tokens: no BOS is added to token-id prompts and no
decode/re-encode round trip can change the count. Ids are drawn uniformly (seeded) from the vocabulary
minus special and added tokens.

Chat prompts have to be text. They are built from words that the model's tokenizer encodes as one token
each, then the length after the model's chat template (as the server renders it) is checked with that
tokenizer and corrected word by word. When the check cannot hit the target, the prompt says so
(`exact=False`), and so does the prompt list.

Every request gets its own random prompt, so vLLM's prefix cache (which reuses whole KV blocks of
identical prefixes) cannot turn a repeated prompt into free prefill. Re-running against the same server
with the same seed would repeat the prompts: give each run its own `seed` (or `stream`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from kvbench.core.tokenizer import load_tokenizer

Api = Literal["completions", "chat"]


@dataclass(frozen=True)
class Workload:
    """One load shape: every request has `prompt_tokens` input and asks for exactly `output_tokens`."""

    prompt_tokens: int
    output_tokens: int
    num_requests: int
    api: Api = "completions"
    seed: int = 0

    def __post_init__(self):
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens}")
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', got {self.api!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Prompt:
    """One request's prompt.

    content: token ids (completions) or the user message text (chat; with `messages`, the last user message).
    num_tokens: prompt tokens the server is expected to count (for chat: after its chat template),
        as counted with the local tokenizer; None when unknown.
    exact: True when the server sees exactly `num_tokens` (token ids always; chat text only when the
        templated length was checked and matched).
    """

    content: list[int] | str
    num_tokens: int | None
    exact: bool
    # Chat only: the whole conversation to send (multi-turn workloads); None sends `content` as one user message.
    messages: tuple[dict[str, str], ...] | None = None

    @classmethod
    def of(cls, value: Prompt | Sequence[int] | str) -> Prompt:
        """Wrap a raw prompt: a list of ids is exact by construction, bare text has an unknown length."""
        if isinstance(value, Prompt):
            return value
        if isinstance(value, str):
            return cls(value, None, False)
        ids = [int(i) for i in value]
        return cls(ids, len(ids), True)


class Prompts(list):
    """The prompts of one workload (a plain list of `Prompt`), plus whether their lengths are exact."""

    def __init__(self, items: Sequence[Prompt], api: Api, note: str):
        super().__init__(items)
        self.api = api
        self.note = note

    @property
    def exact(self) -> bool:
        return all(p.exact for p in self)

    def describe(self) -> dict[str, Any]:
        counts = [p.num_tokens for p in self if p.num_tokens is not None]
        return {
            "api": self.api,
            "count": len(self),
            "lengths_exact": self.exact,
            "prompt_tokens_min": min(counts) if counts else None,
            "prompt_tokens_max": max(counts) if counts else None,
            "note": self.note,
        }


def allowed_token_ids(tokenizer_or_vocab: Any, special_ids: Sequence[int] = ()) -> np.ndarray:
    """Token ids safe to put in a prompt: the base vocabulary minus special and added tokens.

    Accepts a tokenizer, an int vocabulary size (with `special_ids` to exclude), or an explicit sequence of
    allowed ids.
    """
    if isinstance(tokenizer_or_vocab, (int, np.integer)):
        ids = np.arange(int(tokenizer_or_vocab))
        excluded = set(int(i) for i in special_ids)
    elif isinstance(tokenizer_or_vocab, (list, tuple, np.ndarray, range)):
        ids = np.asarray(tokenizer_or_vocab, dtype=np.int64)
        excluded = set(int(i) for i in special_ids)
    else:
        tok = tokenizer_or_vocab
        # vocab_size is the base vocabulary (the model's embedding rows for it); added tokens live in
        # added_tokens_decoder, and some (Llama-3's reserved ids) are special without being in all_special_ids.
        ids = np.arange(int(tok.vocab_size))
        excluded = set(int(i) for i in tok.all_special_ids) | set(int(i) for i in special_ids)
        excluded |= set(int(i) for i in getattr(tok, "added_tokens_decoder", {}) or {})
    allowed = ids[~np.isin(ids, sorted(excluded))] if excluded else ids
    if allowed.size == 0:
        raise ValueError("no token ids left to build prompts from")
    return allowed


def _rng(seed: int, stream: int, index: int) -> np.random.Generator:
    # One independent stream per request: prompt i does not depend on how many prompts were made.
    return np.random.default_rng([int(seed), int(stream), int(index)])


def make_prompts(
    workload: Workload, tokenizer_or_vocab: Any, *, stream: int = 0, special_ids: Sequence[int] = ()
) -> Prompts:
    """`workload.num_requests` prompts of `workload.prompt_tokens` tokens, reproducible from `workload.seed`.

    tokenizer_or_vocab: a tokenizer, a local model directory (its tokenizer is loaded), a vocabulary size
        (completions only), or a sequence of allowed ids (completions only).
    stream: a second seed component; use a different one for warm-up prompts than for measured ones.
    """
    if isinstance(tokenizer_or_vocab, (str, Path)):
        tokenizer_or_vocab = load_tokenizer(tokenizer_or_vocab)
    if workload.api == "completions":
        allowed = allowed_token_ids(tokenizer_or_vocab, special_ids)
        items = [
            Prompt(
                _rng(workload.seed, stream, i).choice(allowed, size=workload.prompt_tokens).tolist(),
                workload.prompt_tokens,
                True,
            )
            for i in range(workload.num_requests)
        ]
        return Prompts(items, "completions", "token-id prompts: the server sees exactly prompt_tokens tokens")
    if isinstance(tokenizer_or_vocab, (int, np.integer, list, tuple, np.ndarray, range)):
        raise ValueError("chat prompts need the model's tokenizer (text must be built and checked), not a vocabulary")
    return _chat_prompts(workload, tokenizer_or_vocab, stream)


# --- chat -----------------------------------------------------------------------------------------


def _encode(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _templated_len(tok, text: str) -> int:
    """Prompt tokens the server counts for one user message: its chat template rendered, then tokenized
    without extra special tokens (vLLM's chat path; the template itself adds BOS where the model wants one)."""
    if getattr(tok, "chat_template", None):
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return len(_encode(tok, rendered))
    return len(_encode(tok, text))


def _single_token_words(tok) -> list[str]:
    """Words (ASCII letters only) that encode to exactly one token both alone and after a space."""
    words = set()
    for i in allowed_token_ids(tok).tolist():
        w = tok.decode([i]).strip()
        if len(w) >= 2 and w.isascii() and w.isalpha():
            words.add(w)
    good = [w for w in sorted(words) if len(_encode(tok, " " + w)) == 1 and len(_encode(tok, w)) == 1]
    if not good:
        # Tokenizers without such words (rare): fall back to any alphabetic word; the length check below
        # still corrects the count.
        good = sorted(words) or ["the"]
    return good


def _chat_prompts(workload: Workload, tok, stream: int) -> Prompts:
    words = _single_token_words(tok)
    overhead = _templated_len(tok, "")
    target = workload.prompt_tokens
    items = []
    for i in range(workload.num_requests):
        rng = _rng(workload.seed, stream, i)
        pool = [words[j] for j in rng.integers(0, len(words), size=max(1, target) + 64)]
        n_words = max(1, target - overhead)
        text, measured = _fit(tok, pool, n_words, target)
        items.append(Prompt(text, measured, measured == target))
    prompts = Prompts(items, "chat", "")
    if prompts.exact:
        prompts.note = "chat text prompts; templated length checked with the model's tokenizer and chat template"
    else:
        off = sum(1 for p in prompts if not p.exact)
        prompts.note = (
            f"chat prompt lengths are approximate: {off} of {len(prompts)} could not be made exactly "
            f"{target} tokens after the chat template (template alone: {overhead} tokens); "
            "num_tokens holds the local count, the server's usage.prompt_tokens is authoritative"
        )
    return prompts


def _fit(tok, pool: list[str], n_words: int, target: int) -> tuple[str, int]:
    """Adjust the word count until the templated length equals target (or give up after a few steps)."""
    n = max(1, min(n_words, len(pool)))
    best = None
    for _ in range(16):
        text = " ".join(pool[:n])
        measured = _templated_len(tok, text)
        if best is None or abs(measured - target) < abs(best[1] - target):
            best = (text, measured)
        if measured == target:
            break
        step = target - measured
        new_n = max(1, min(len(pool), n + step))
        if new_n == n:
            break
        n = new_n
    return best
