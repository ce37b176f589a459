"""NVFP4 K/V in plain transformers: the independent check on kvbench's CPU NVFP4 backend (kernels/cpu_emulated.py).

An attention function for transformers' AttentionInterface that rounds every K and V row through
kvbench.kernels.nvfp4 (quantize with the writer's rules, decode back to the model dtype) and then runs the stock
SDPA attention: what the backend stores and reads, with no vLLM code in the path. K arrives after RoPE, as vLLM
caches it. Quantization is per (token, head) row, so re-rounding the whole cache at every step gives the same
values as rounding each token once when it is written.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvbench.kernels import nvfp4


def register(name: str = "kvbench_nvfp4", k_scale: float = 1.0, v_scale: float = 1.0) -> str:
    """Register the attention function under `name` (pass it as attn_implementation) and return the name."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        key = nvfp4.quant_dequant(key, k_scale).to(key.dtype)  # [batch, heads, tokens, head_dim]
        value = nvfp4.quant_dequant(value, v_scale).to(value.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(name, attention)
    return name


def load(model_dir: str | Path, nvfp4_kv: bool = True):
    """(model, tokenizer) in bf16, as vLLM serves the tiny model; with nvfp4_kv, K/V rounded through NVFP4."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    impl = register() if nvfp4_kv else "sdpa"
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16, attn_implementation=impl)
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)


@torch.inference_mode()
def greedy(model, tok, prompt: str, max_new_tokens: int, stop: tuple[str, ...] = ()) -> str:
    """The greedy continuation of `prompt`, cut before the first stop string (as vLLM's `stop` does)."""
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


@torch.inference_mode()
def divergence(model, tok, prompt: str, served: str, max_new_tokens: int, stop_ids: set[int]):
    """Where the reference's greedy choice first departs from a served continuation, and by how much.

    The served text is fed back token by token (teacher forcing); at each step the reference's own choice is
    compared with the served token, and where the served text ends short of `max_new_tokens`, with the best
    of `stop_ids` (evaltasks.stop_token_ids: the engine stopped there). Returns None when the reference would have
    produced the served text itself, else (step, gap): the reference's logit for its own choice minus its
    logit for the served one. A small gap is a near tie that bf16 rounding in a different kernel can flip
    (NVFP4 rounds K/V to 4 bits, so a K value on a code boundary amplifies such a flip); a large one means
    the two computed different things.
    """
    prompt_ids = tok(prompt, return_tensors="pt").input_ids
    served_ids = tok(served, add_special_tokens=False, return_tensors="pt").input_ids
    logits = model(torch.cat([prompt_ids, served_ids], 1)).logits[0, prompt_ids.shape[1] - 1 :].float()
    for step, token in enumerate(served_ids[0].tolist()):
        choice = int(logits[step].argmax())
        if choice != token:
            return step, float(logits[step, choice] - logits[step, token])
    if served_ids.shape[1] >= max_new_tokens:
        return None
    enders = sorted(stop_ids)
    last = logits[served_ids.shape[1]]
    choice = int(last.argmax())
    if choice in enders:
        return None
    return served_ids.shape[1], float(last[choice] - last[enders].max())


# -- the cross-check's criterion, calibrated on the reference's own spread ---------------------------------

ALPHA = 0.001  # a correct backend fails the share test about once in a thousand runs
GAP_MARGIN = (
    1.0  # gaps up to the largest a perturbed reference showed (at 1.5x, 7 of 40 stop-early controls pass alone)
)


def spread_bounds(spread: dict) -> dict:
    """What correct implementations may differ by, from scripts/nvfp4_reference_spread.py's measurements:
    `rate`: a one-sided 95% upper bound on the share of differing answers (pooled over the perturbation runs);
    `gap`: GAP_MARGIN x the largest parting gap any run showed (logits)."""
    from scipy import stats

    runs = spread["runs"]
    k, n = sum(r["differing"] for r in runs), spread["items"] * len(runs)
    rate = float(stats.beta.ppf(0.95, k + 1, n - k)) if k < n else 1.0
    gaps = [g for r in runs for g in r["gaps"] if g is not None]
    return {"rate": rate, "gap": GAP_MARGIN * max(gaps, default=0.0), "runs": len(runs), "differing": k, "of": n}


def judge(parted: list[float | None], n: int, spread: dict) -> tuple[bool, str]:
    """(pass, why) for a backend whose answers differ from the reference's on len(parted) of n items, each
    parting at the given gap (None: the reference would have produced the served text itself). Passes when
    the share differing is within what correct implementations show (binomial, ALPHA) and every parting gap is
    within theirs."""
    from scipy import stats

    b = spread_bounds(spread)
    allowed = int(stats.binom.ppf(1 - ALPHA, n, b["rate"]))
    wide = [g for g in parted if g is not None and g > b["gap"]]
    why = (
        f"{len(parted)} of {n} answers differ (allowed {allowed}: perturbed references differed on {b['differing']} "
        f"of {b['of']}); {len(wide)} part at a gap over {b['gap']:.2f} logits"
    )
    return len(parted) <= allowed and not wide, why
