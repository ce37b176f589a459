"""The state one `build` call shares with every kind: the spec, the tokenizer, the seed streams, the notes."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from kvbench.core.errors import UsageError
from kvbench.core.tokenizer import load_tokenizer
from kvbench.harness.client.workload import (
    Prompt,
    _encode,
    _fit,
    _single_token_words,
    _templated_len,
    allowed_token_ids,
)
from kvbench.harness.workloads.plan import PlannedRequest, RequestPlan

# Seed-sequence salts: one per use, large so they never equal a request index (numpy ignores trailing zero
# words of a seed sequence, so each salt is used with one arity only).
_SALT = {
    name: 2**31 + i
    for i, name in enumerate(
        ("random", "prefix", "suffix", "shuffle", "session", "block", "unique", "jsonl", "chat", "dataset")
    )
}


def _rng(seed: int, stream: int, salt: str, *index: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(stream), _SALT[salt], *(int(i) for i in index)])


class _Context:
    def __init__(self, tokenizer, spec, seed, stream, max_model_len, api):
        if isinstance(tokenizer, (str, Path)):
            tokenizer = load_tokenizer(tokenizer)
        self.is_vocab = isinstance(tokenizer, (int, np.integer, list, tuple, np.ndarray, range))
        self.tok = None if self.is_vocab else tokenizer
        self.source = tokenizer
        self.spec, self.seed, self.stream, self.mml, self.api = spec, seed, stream, max_model_len, api
        self.notes: list[str] = []
        if self.tok is None and (api == "chat" or spec.kind in ("sharegpt", "jsonl")):
            over = " over chat" if api == "chat" else ""
            raise UsageError(f"{spec.kind} workloads{over} need the model's tokenizer, not a vocabulary size")

    @cached_property
    def allowed(self) -> np.ndarray:
        return allowed_token_ids(self.source)

    @cached_property
    def words(self) -> list[str]:
        return _single_token_words(self.tok)

    @cached_property
    def overhead(self) -> int:
        return _templated_len(self.tok, "")

    def n(self, num_requests: int | None, natural: int | None = None) -> int:
        n = num_requests if num_requests is not None else getattr(self.spec, "num_requests", None)
        n = natural if n is None else n
        if n is None:
            raise UsageError(f"workload {self.spec.label}: give num_requests (in its spec, or --num-requests)")
        return n

    # -- prompts ------------------------------------------------------------------------------------

    def ids(self, rng: np.random.Generator, n: int) -> list[int]:
        return rng.choice(self.allowed, size=n).tolist()

    def synthetic(self, rng: np.random.Generator, n: int) -> tuple[Prompt, tuple[int, ...]]:
        """A prompt of exactly n tokens: token ids, or chat text fitted to n templated tokens."""
        if self.api == "completions":
            ids = self.ids(rng, n)
            return Prompt(ids, n, True), tuple(ids)
        pool = [self.words[j] for j in rng.integers(0, len(self.words), size=n + 64)]
        text, measured = _fit(self.tok, pool, max(1, n - self.overhead), n)
        return Prompt(text, measured, measured == n), tuple(self.chat_ids([{"role": "user", "content": text}]))

    def text(self, text: str) -> tuple[Prompt, tuple[int, ...]]:
        """A dataset text as it is sent: completions counts it as the server does (special tokens added)."""
        if self.api == "completions":
            ids = tuple(self.tok(text).input_ids)
            return Prompt(text, len(ids), True), ids
        ids = tuple(self.chat_ids([{"role": "user", "content": text}]))
        return Prompt(text, len(ids), True), ids

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        if not getattr(self.tok, "chat_template", None):
            if len(messages) == 1:
                return _encode(self.tok, messages[0]["content"])
            raise UsageError("multi-turn chat workloads need a tokenizer with a chat template")
        rendered = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return _encode(self.tok, rendered)

    def words_text(self, rng: np.random.Generator, n: int) -> str:
        """n single-token words: n content tokens."""
        return " ".join(self.words[j] for j in rng.integers(0, len(self.words), size=n))

    def fit(self, prompt: int, output: int) -> tuple[int, int, bool]:
        """Clip so prompt + output <= max_model_len; the prompt gives way."""
        if self.mml is None or prompt + output <= self.mml:
            return prompt, output, False
        output = min(output, self.mml - 1)
        return max(1, self.mml - output), output, True

    def plan(self, requests: list[PlannedRequest], **kw) -> RequestPlan:
        off = sum(1 for r in requests if not r.prompt.exact)
        if off and self.spec.kind != "fixed":  # fixed: make_prompts' own note says it
            self.notes.append(
                f"chat prompt lengths are approximate: {off} of {len(requests)} could not be made "
                f"exactly their length after the chat template (template alone: {self.overhead} "
                "tokens); num_tokens holds the local count"
            )
        return RequestPlan(
            self.spec, self.api, self.seed, self.stream, self.mml, tuple(requests), notes=tuple(self.notes), **kw
        )


def _too_long(ctx: _Context, what: str, total: int) -> UsageError:
    return UsageError(f"workload {ctx.spec.label}: {what} = {total} tokens does not fit max_model_len {ctx.mml}")
