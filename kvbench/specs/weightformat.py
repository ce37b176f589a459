"""How a checkpoint stores its weights (its quantization_config): bytes per parameter, and the bytes in all."""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.core.errors import UsageError
from kvbench.specs.modelspec import DTYPE_BYTES


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores its linear layers: bytes per parameter, scales included."""

    key: str  # "bfloat16", "fp8", "int8", "int4", "mxfp4"...
    label: str
    bytes_per_param: float
    experts_only: bool = False  # gpt-oss: only the MoE experts are quantized
    expert_bytes_per_param: float | None = None  # routed experts stored otherwise than the other linear layers


def checkpoint_weight_format(source: str, quant: dict, act_dtype: str) -> WeightFormat:
    """The weight format a config's quantization_config describes (or the activation dtype without one)."""
    method = str(quant.get("quant_method", "")).lower()
    if not method:
        return WeightFormat(act_dtype, act_dtype, DTYPE_BYTES[act_dtype])
    if method == "fp8":
        # FP8 with one FP32 scale per 128x128 block; embeddings, norms, router stay 16-bit.
        block = quant.get("weight_block_size") or [128, 128]
        if quant.get("expert_dtype") == "fp4":
            # DeepSeek V4 (config expert_dtype, copied here by kvbench.specs.hfconfig): MXFP4 routed experts
            # (vllm/models/deepseek_v4/quant_config.py: Mxfp4MoEMethod, 4 bits + a UE8M0 scale per 32 values)
            return WeightFormat(
                "fp8",
                f"fp8 (block-scaled) + MXFP4 experts + {act_dtype}",
                1.0 + 4.0 / (block[0] * block[1]),
                expert_bytes_per_param=4.25 / 8,
            )
        return WeightFormat("fp8", f"fp8 (block-scaled) + {act_dtype}", 1.0 + 4.0 / (block[0] * block[1]))
    if method == "mxfp4":
        # gpt-oss: MoE experts in MXFP4 (4 bits + one E8M0 scale per 32 values); the rest 16-bit.
        return WeightFormat("mxfp4", f"mxfp4 experts + {act_dtype}", 4.25 / 8, experts_only=True)
    if method == "compressed-tensors":
        groups = quant.get("config_groups") or {}
        weights = next(iter(groups.values()), {}).get("weights") or {} if isinstance(groups, dict) else {}
        bits, group = weights.get("num_bits"), weights.get("group_size")
        if bits in (4, 8):
            # per-group (bf16 scale per `group` values) or per-channel scales
            scale = 2.0 / group if group else 0.0
            return WeightFormat(f"int{bits}", f"int{bits} + {act_dtype}", bits / 8 + scale)
    if method == "modelopt" and "NVFP4" in str(quant.get("quant_algo", "")) + str(quant.get("quantized_layers", "")):
        # ModelOpt NVFP4: E2M1 + one E4M3 scale per 16 values; the layers it keeps in FP8 (a minority in
        # NVIDIA's Qwen3.6 re-quants) are counted at the same rate, an underestimate stated in the label.
        return WeightFormat("nvfp4", f"nvfp4 (modelopt, FP8 layers counted as nvfp4) + {act_dtype}", 4.5 / 8)
    if method == "modelopt" and "FP8" in str(quant.get("quant_algo", "")):
        return WeightFormat("fp8", f"fp8 (modelopt) + {act_dtype}", 1.0)
    bits = quant.get("bits") or quant.get("w_bit")
    if bits in (2, 3, 4, 8):  # GPTQ/AWQ-style integer weights with a 16-bit scale per group
        group = quant.get("group_size") or quant.get("q_group_size") or 128
        return WeightFormat(f"int{bits}", f"int{bits} + {act_dtype}", bits / 8 + 2.0 / group)
    raise UsageError(
        f"{source}: quantization_config quant_method {method!r} is not modelled; "
        "supported: fp8, mxfp4, compressed-tensors int4/int8, or any method with 'bits'"
    )
