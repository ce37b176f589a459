"""Task accuracy in plain torch + transformers, no vLLM: greedy exact match on kvbench's own task items, with the
K/V cache's values fake-quantized as vLLM would store them.

What it is for: checking a model against its task bars where no server runs (the test suite, the trainer's
report), and asking whether a task separates the KV dtypes before anyone serves them. The quantization is the
reference numerics of the dtype's registry entry (the Codec its `numerics` module registers,
kvbench.kernels.codecs) applied to every K and V row inside attention, after RoPE and before the attention
product, with vLLM's default scales (k_scale = v_scale = 1.0): what vLLM writes into such a cache and reads
back. The query, the attention product and everything else stay in the model's dtype (bf16 here, as the CPU
default serves it), as on SM8x/SM90.

Scoring is greedy and exact, as lm-eval's generate_until scores a bundled task (kvbench.specs.evaltasks.score). Items
are checked in batches by teacher forcing (one forward over prompt + answer: each answer token must be the
argmax, and the token after it a stop); an item that fails that check is generated token by token and scored
on its text, so an answer the model spells with other tokens still counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from kvbench.core.datafiles import data_path
from kvbench.core.errors import UsageError
from kvbench.specs import evaltasks
from kvbench.specs.formats import catalog, dtype_order, get_format, numerics_modules, tracked_dtypes

KV_DTYPES = tracked_dtypes()  # the tracked dtypes (formats.toml): what the trainer's report scores by default
_ATTENTION = "kvbench_fake_quant_kv"


def scored_dtypes() -> tuple[str, ...]:
    """Every dtype fake_quant can store: `auto` and each registry format with numerics, in the registry's order."""
    modules = numerics_modules()
    return ("auto", *(f for f in dtype_order() if f in catalog() and f in modules))


def _codec(kv_dtype: str):
    """The Codec a `kv_dtype` cache reads back through (None: `auto`, the model's own dtype). Looked up once per
    registry file and dtype: attention asks on every call."""
    return _codec_in(data_path("formats.toml"), kv_dtype)


@cache
def _codec_in(registry: Path, kv_dtype: str):
    from kvbench.kernels import codecs

    try:
        fmt = get_format(kv_dtype)
    except UsageError:
        fmt = None
    if fmt is not None and fmt.key == "auto":
        return None
    if fmt is None or fmt.key not in scored_dtypes():
        tracked, others = KV_DTYPES, [d for d in scored_dtypes() if d not in KV_DTYPES]
        raise UsageError(
            f"unknown KV dtype {kv_dtype!r}; choose from: {', '.join(tracked)} (tracked), or {', '.join(others)}"
        )
    return codecs.get(fmt.key)


def fake_quant(x, kv_dtype: str, side: str = "k"):
    """x [..., head_dim] as it reads back from a `kv_dtype` cache, in x's dtype; `side` "v" for values (a codec
    that stores V otherwise, turboquant's, has its own round trip)."""
    codec = _codec(kv_dtype)
    if codec is None:
        return x
    round_trip = codec.quant_dequant_v if side == "v" and codec.quant_dequant_v else codec.quant_dequant
    return (round_trip(x, scale=1.0) if codec.scaled else round_trip(x)).to(x.dtype)


def _register(kv_dtype_of: Callable[[], str]) -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        # Every row is quantized on its own, so quantizing the whole cache at each call equals quantizing
        # each token once when it is written.
        dtype = kv_dtype_of()
        return sdpa_attention_forward(
            module, query, fake_quant(key, dtype), fake_quant(value, dtype, "v"), attention_mask, **kwargs
        )

    AttentionInterface.register(_ATTENTION, attention)


class _Switch:
    dtype = "auto"


_SWITCH = _Switch()


def prepare(model) -> None:
    """Route the model's attention through the fake-quantizing function (once per model)."""
    _register(lambda: _SWITCH.dtype)
    model.set_attn_implementation(_ATTENTION)


@dataclass
class TaskScore:
    task: str
    kv_dtype: str
    correct: list[int] = field(default_factory=list)  # 0/1 per item, in item order

    @property
    def n(self) -> int:
        return len(self.correct)

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / self.n if self.n else math.nan

    def wilson(self) -> tuple[float, float]:
        from kvbench.core.stats import wilson

        return wilson(sum(self.correct), self.n)

    def summary(self) -> dict:
        lo, hi = self.wilson()
        return {
            "task": self.task,
            "kv_dtype": self.kv_dtype,
            "n": self.n,
            "correct": sum(self.correct),
            "accuracy": self.accuracy,
            "wilson95": [lo, hi],
        }


def score_items(model, tok, task: str, items: Sequence[evaltasks.Item], kv_dtype: str = "auto", batch: int = 16):
    """Greedy exact match of `model` on `items` with a `kv_dtype` cache; a TaskScore (call prepare(model) first)."""
    import torch

    kind, _ = evaltasks.parse_task(task)
    stops = evaltasks.stop_token_ids(tok)
    out = TaskScore(task, kv_dtype)
    _SWITCH.dtype = kv_dtype
    try:
        with torch.no_grad():
            for start in range(0, len(items), batch):
                chunk = items[start : start + batch]
                prompts = [tok.encode(item.prompt) for item in chunk]
                answers = [
                    tok.encode(evaltasks.continuation(kind, item.answer), add_special_tokens=False) for item in chunk
                ]
                rows = [p + a for p, a in zip(prompts, answers, strict=True)]
                width = max(map(len, rows))
                ids = torch.full((len(rows), width), tok.eos_token_id, dtype=torch.long)
                for i, row in enumerate(rows):
                    ids[i, : len(row)] = torch.tensor(row)
                # Right padding: causal attention never lets a row's real tokens see its padding.
                pred = model(input_ids=ids).logits.argmax(-1)
                for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
                    at = len(p) - 1  # the logits at position t predict token t + 1
                    ok = pred[i, at : at + len(a)].tolist() == a and int(pred[i, at + len(a)]) in stops
                    if not ok:
                        ok = bool(_generate_and_score(model, tok, p, chunk[i].answer, kind))
                    out.correct.append(int(ok))
    finally:
        _SWITCH.dtype = "auto"
    return out


def _generate_and_score(model, tok, prompt_ids: list[int], answer: str, kind: str) -> int:
    import torch

    ids = torch.tensor([prompt_ids])
    gen = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=evaltasks.MAX_GEN_TOKS[kind],
        do_sample=False,
        pad_token_id=tok.eos_token_id,
    )
    return evaltasks.score(tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True), answer)


def load(path, dtype: str = "bfloat16"):
    """(model, tokenizer) from a local folder, in `dtype` (bf16: as the CPU default serves it), ready to score."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype), local_files_only=True)
    model.eval()
    prepare(model)
    return model, tok


def measure(
    model, tok, tasks: Sequence[str], n: int, kv_dtypes: Sequence[str] = KV_DTYPES, log=None, seed=evaltasks.SEED
) -> list[TaskScore]:
    """Each task's first `n` evaluation items (the ones kvbench eval sends) under each KV dtype."""
    scores = []
    for task in tasks:
        items = evaltasks.generate(task, tok, n, seed)
        for dtype in kv_dtypes:
            s = score_items(model, tok, task, items, dtype)
            scores.append(s)
            if log:
                lo, hi = s.wilson()
                log(f"{task} {dtype}: {sum(s.correct)}/{s.n} = {s.accuracy:.1%} (95% CI {lo:.1%}-{hi:.1%})")
    return scores
