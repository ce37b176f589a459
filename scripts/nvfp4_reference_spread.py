"""Measure how far correct implementations of the NVFP4 cross-check's reference spread (issue 36).

tests/e2e/test_run_vllm.py compares vLLM's nvfp4 answers with transformers' (kernels/hf_nvfp4.py). Two
correct implementations differ in bf16 rounding, and rounding K/V to 4 bits can turn a last-bit difference
into a code step, so some answers part at near ties. This script measures that spread on the same items,
from controlled perturbations of the reference itself (no implementation change):
  - bf16 jitter: every K and V element moved by -1, 0 or +1 bf16 step (uniform, seeded) before the NVFP4
    rounding, `--jitter-runs` seeds;
  - another attention kernel: transformers' eager attention instead of SDPA, same NVFP4 rounding.
For each: how many of the items' greedy answers differ from the unperturbed reference, and for each that
differs, the parting gap (hf_nvfp4.divergence against the unperturbed reference). Negative controls, the
kind of answer a broken backend gives: the reference answer with one digit wrong, and stopped early.

Writes tests/data/nvfp4_reference_spread.json, which the e2e cross-check reads. Run under the heavy lock:
    flock /tmp/kvbench-heavy.lock .venv/bin/python scripts/nvfp4_reference_spread.py
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from kvbench.kernels import hf_nvfp4, nvfp4
from kvbench.specs import evaltasks
from kvbench.tinymodel.build import ensure_trained_model

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "nvfp4_reference_spread.json"
TASK = "kvbench_needle_512"  # the e2e cross-check's task and items (the first 40)


def jittered(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """x (bf16) with every element moved by -1, 0 or +1 bf16 step (to the next representable value)."""
    step = torch.randint(-1, 2, x.shape, generator=gen)
    up, down = (
        torch.nextafter(x, torch.full_like(x, float("inf"))),
        torch.nextafter(x, torch.full_like(x, -float("inf"))),
    )
    return torch.where(step > 0, up, torch.where(step < 0, down, x))


def additive_mask(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The mask SDPA is given (boolean, or None with causal prefill) as the additive mask eager attention adds."""
    q, k = query.shape[-2], key.shape[-2]
    if mask is None:
        mask = torch.ones(q, k, dtype=torch.bool).tril(diagonal=k - q)[None, None]
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype).masked_fill(~mask, torch.finfo(query.dtype).min)
    return mask


def register(name: str, *, seed: int | None = None, eager: bool = False) -> str:
    """An NVFP4 attention like hf_nvfp4.register's, perturbed: K/V jittered (seed) or the eager kernel."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    eager_forward = importlib.import_module("transformers.models.llama.modeling_llama").eager_attention_forward
    gen = torch.Generator().manual_seed(seed) if seed is not None else None

    def attention(module, query, key, value, attention_mask, **kwargs):
        if gen is not None:
            key, value = jittered(key, gen), jittered(value, gen)
        key = nvfp4.quant_dequant(key).to(query.dtype)
        value = nvfp4.quant_dequant(value).to(query.dtype)
        if eager:
            return eager_forward(module, query, key, value, additive_mask(attention_mask, query, key), **kwargs)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(name, attention)
    return name


def answers(model, tok, items, max_toks):
    return [hf_nvfp4.greedy(model, tok, it.prompt, max_toks, evaltasks.STOP) for it in items]


def spread(reference, tok, items, max_toks, stops, ref_answers, texts) -> dict:
    """How many answers differ from the reference's, and each differing answer's parting gap."""
    gaps, differing = [], 0
    for it, mine, other in zip(items, ref_answers, texts, strict=True):
        if mine.strip() == other.strip():
            continue
        differing += 1
        part = hf_nvfp4.divergence(reference, tok, it.prompt, other, max_toks, stops)
        gaps.append(None if part is None else round(part[1], 4))
    return {"differing": differing, "gaps": gaps}


def wrong_digit(text: str) -> str:
    for i, ch in enumerate(text):
        if ch.isdigit():
            return text[:i] + str((int(ch) + 1) % 10) + text[i + 1 :]
    return text + "0"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--jitter-runs", type=int, default=6)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    model_dir = ensure_trained_model()
    reference, tok = hf_nvfp4.load(model_dir)
    kind, _ = evaltasks.parse_task(TASK)
    max_toks, stops = evaltasks.MAX_GEN_TOKS[kind], evaltasks.stop_token_ids(tok)
    items = evaltasks.generate(TASK, tok, args.items)
    ref = answers(reference, tok, items, max_toks)
    from transformers import AutoModelForCausalLM

    def perturbed(label, **kw):
        impl = register(f"kvbench_nvfp4_{label}", **kw)
        m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16, attn_implementation=impl)
        row = spread(reference, tok, items, max_toks, stops, ref, answers(m.eval(), tok, items, max_toks))
        print(label, row, f"{time.perf_counter() - t0:.0f} s", flush=True)
        return {"perturbation": label, **row}

    runs = [perturbed(f"bf16-jitter-seed{s}", seed=s) for s in range(args.jitter_runs)]
    runs.append(perturbed("eager-attention", eager=True))
    controls = {
        "wrong_digit": spread(reference, tok, items, max_toks, stops, ref, [wrong_digit(a) for a in ref]),
        "stop_early": spread(reference, tok, items, max_toks, stops, ref, [a[: len(a) // 2] for a in ref]),
    }
    doc = {
        "what": "spread of the NVFP4 cross-check's transformers reference under controlled perturbations",
        "how": (
            f"scripts/nvfp4_reference_spread.py: the trained tiny model (kvbench/data/tinymodel), bf16, K/V "
            f"rounded through kvbench.kernels.nvfp4; task {TASK}, first {args.items} items, greedy; each "
            "perturbation's answers compared with the unperturbed reference's, each differing answer's parting "
            "gap (logits) from hf_nvfp4.divergence against the unperturbed reference"
        ),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__},
        "task": TASK,
        "items": args.items,
        "runs": runs,
        "negative_controls": controls,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out} in {doc['wall_s']} s")


if __name__ == "__main__":
    main()
