"""`build(spec, tokenizer, ...)`: the requests a workload spec asks for, exact in tokens, reproducible.

Deterministic from (seed, stream): the same pair gives the same plan (so every KV dtype is sent the same
requests), a different stream gives fresh prompts, so vLLM's prefix cache never sees one phase's prompts
again in the next; only the repeats a workload intends (shared prefixes, a conversation resent, trace blocks
under the same hash id) remain, and those are fresh per stream too. Dataset kinds send the file's texts:
a different stream draws them in another order, but a small file repeats texts across phases.

Prompts are token ids for the completions API (the server sees exactly those tokens) and text for chat
(built from words that are one token each, the templated length checked with the model's tokenizer, as
kvbench.harness.client.workload does). Shared-prefix and trace workloads need the completions API: only token ids
guarantee that the intended leading tokens are identical.

max_model_len: synthetic lengths (random, trace) are clipped so prompt + output fits (the prompt gives way;
the plan's notes count them); dataset rows that do not fit are skipped, as the server would refuse them;
fixed, shared-prefix and multi-turn turn 0 refuse a spec that cannot fit; multi-turn sessions end before
the turn that would not fit.
"""

from __future__ import annotations

from typing import Any

from kvbench.core.errors import UsageError
from kvbench.harness.workloads.context import _Context
from kvbench.harness.workloads.datasets import _jsonl, _sharegpt
from kvbench.harness.workloads.plan import RequestPlan
from kvbench.harness.workloads.synthetic import _fixed, _multi_turn, _random, _shared_prefix
from kvbench.harness.workloads.trace import _trace, read_trace, trace_timing

# read_trace and trace_timing stay importable from here (kvbench.harness.run.defaults and the package use them).
__all__ = ["build", "read_trace", "trace_timing"]


def build(
    spec,
    tokenizer: Any,
    *,
    seed: int = 0,
    stream: int = 0,
    max_model_len: int | None = None,
    api: str = "completions",
    num_requests: int | None = None,
) -> RequestPlan:
    """The plan for `spec`.

    tokenizer: the served model's tokenizer, or a local model folder (its tokenizer is loaded); synthetic
        completions kinds also accept a vocabulary size or a sequence of allowed ids.
    seed, stream: determinism (see the module docstring); with stream 0, `random` draws its lengths from
        numpy's default_rng(seed) exactly as `vllm bench serve --dataset-name random --seed` does, and
        `sharegpt` shuffles with Python's random.seed(seed) exactly as vLLM does.
    max_model_len: the server's context length (None: no limit).
    num_requests: overrides the spec's (a warm-up or probe phase asks for its own count). Multi-turn counts
        turns: sessions are made in order (past `sessions` if need be) until that many, the last one cut.
        Traces replay their first num_requests records and refuse more than they hold.
    """
    if api not in ("completions", "chat"):
        raise UsageError(f"api must be completions or chat, got {api!r}")
    if max_model_len is not None and max_model_len < 2:
        raise UsageError(f"max_model_len must be >= 2 tokens (a prompt and an output token), got {max_model_len}")
    if num_requests is not None and num_requests < 1:
        raise UsageError(f"num_requests must be a whole number >= 1, got {num_requests}")
    if api == "chat" and spec.kind in ("shared-prefix", "trace"):
        raise UsageError(
            f"{spec.kind} workloads need --api completions: only token-id prompts guarantee that "
            "the intended leading tokens are identical"
        )
    ctx = _Context(tokenizer, spec, seed, stream, max_model_len, api)
    builder = {
        "fixed": _fixed,
        "random": _random,
        "sharegpt": _sharegpt,
        "jsonl": _jsonl,
        "shared-prefix": _shared_prefix,
        "multi-turn": _multi_turn,
        "trace": _trace,
    }[spec.kind]
    return builder(ctx, num_requests)
