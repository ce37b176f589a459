"""The KV-cache budget of a CPU run of a model the user names (`kvbench run --model <folder>` without a GPU).

The CPU default's fixed budget (run_defaults.toml [cpu] kv_cache_memory_bytes, 16 sequences of the tiny model)
would hold no request of a real model, and vLLM's CPU backend otherwise takes a fixed 4 GiB. So the budget is
sized from the model and the run: enough `auto` sequences of max_model_len tokens for the SLO search cap
(--search-cap), else for the run's largest fixed concurrency, in whole CPU blocks as vLLM allocates them
(kvbench.specs.capacity's page accounting), and never more than a fraction of the memory free after the weights.
The user's `--kv-cache-memory-bytes` (kvbench's flag, or vLLM's after --) wins over all of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.core.errors import UsageError
from kvbench.core.units import GiB, MiB, fmt_both


def _fmt(n: float) -> str:
    """MiB below a GiB (a small model's budget reads 0.00 GB otherwise), GB and GiB above."""
    return f"{n / MiB:,.1f} MiB" if abs(n) < GiB else fmt_both(n)


@dataclass(frozen=True)
class KvBudget:
    bytes: int
    sequences: int  # auto sequences of max_model_len the budget holds
    wanted: int  # sequences it was sized for
    bytes_per_sequence: int
    source: str  # one line: what the number is and where it comes from

    def note(self) -> str:
        return f"CPU KV cache: {self.bytes:,} bytes ({_fmt(self.bytes)}), {self.source}"


def free_memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def bytes_per_sequence(spec, max_model_len: int) -> int:
    """Bytes one `auto` request of max_model_len tokens takes in vLLM's CPU cache (whole blocks, every layer)."""
    from kvbench.specs.capacity import VLLM_CPU_BLOCK_SIZE, budget_from_bytes, capacity_row
    from kvbench.specs.formats import get_format

    row = capacity_row(spec, get_format("auto"), max_model_len, budget_from_bytes(0), block_size=VLLM_CPU_BLOCK_SIZE)
    return int(row.bytes_per_user)


def size(
    spec,
    max_model_len: int,
    wanted: int,
    why: str,
    free_bytes: int,
    free_fraction: float,
) -> KvBudget:
    """The budget for `wanted` auto sequences of `max_model_len` tokens of `spec`, bounded by `free_fraction` of
    `free_bytes` less the weights. One line (UsageError) when not even one sequence fits."""
    per_seq = bytes_per_sequence(spec, max_model_len)
    weights = int(spec.weight_bytes)
    bound = int(max(0, free_bytes - weights) * free_fraction)
    fits = bound // per_seq
    shape = (
        f"{spec.name}: {per_seq:,} bytes per {max_model_len}-token sequence at auto "
        f"({spec.num_layers} layers x {spec.num_kv_heads} KV heads x head_dim {spec.head_dim}, from {spec.source})"
    )
    if fits < 1:
        raise UsageError(
            f"the KV cache for one {max_model_len}-token sequence of {spec.name} needs {_fmt(per_seq)}, but "
            f"{free_fraction:.0%} of the memory free after its weights is {_fmt(bound)}; lower --max-model-len "
            "or give --kv-cache-memory-bytes"
        )
    if fits >= wanted:
        return KvBudget(wanted * per_seq, wanted, wanted, per_seq, f"sized for {wanted} sequences ({why}); {shape}")
    return KvBudget(
        fits * per_seq,
        int(fits),
        wanted,
        per_seq,
        f"{fits} sequences, not the {wanted} wanted ({why}): bounded by {free_fraction:.0%} of the "
        f"{_fmt(free_bytes - weights)} free after the weights; {shape}",
    )


def for_run(
    model: str,
    max_model_len: int,
    search_cap: int | None,
    concurrency: list[int],
    free_fraction: float,
    free_bytes: int | None = None,
) -> KvBudget:
    """The budget of a CPU run of `model` (a local folder with config.json, or a shipped short name)."""
    from kvbench.specs.models import load_model

    try:
        spec = load_model(model)
    except UsageError:
        raise UsageError(
            f"cannot size the CPU KV cache for --model {model!r}: no config.json there; give --kv-cache-memory-bytes"
        ) from None
    if search_cap is not None:
        wanted, why = search_cap, "the SLO search cap, --search-cap"
    else:
        wanted = max(concurrency) if concurrency else 1
        why = f"the run's concurrency {wanted}; --search-cap N sizes it for N"
    free = free_memory_bytes() if free_bytes is None else free_bytes
    return size(spec, max_model_len, wanted, why, free, free_fraction)


def parse_bytes(value: int | None) -> int | None:
    """--kv-cache-memory-bytes: a whole number of bytes >= 1 (None: not given)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or not math.isfinite(value):
        raise UsageError(f"--kv-cache-memory-bytes must be a whole number of bytes >= 1, got {value!r}")
    return value
