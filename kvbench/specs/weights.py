"""Weight bytes per GPU as vLLM loads them: weight format, tensor- and pipeline-parallel sharding.

What vLLM's "Model loading took X GiB" counts on one rank (vllm/model_executor/layers/linear.py,
vocab_parallel_embedding.py, rotary_embedding/, distributed/utils.py get_pp_indices):
  * linear layers (attention, MLP, experts) split across the TP ranks; K/V projections are replicated
    once TP exceeds the KV-head count; norms and MoE routers are replicated;
  * embedding and lm_head rows padded to a multiple of 64 and split across the TP ranks (an untied
    lm_head is a second matrix; a tied one is the embedding, except on a pipeline stage of its own);
  * pipeline stages hold consecutive layers (the remainder to the stages before the last), the
    embedding on the first and the final norm and lm_head on the last;
  * the rotary cos/sin cache (max_position_embeddings x rotary dim, model dtype) on every rank;
  * MLA keeps W_UK and W_UV, split copies of kv_b_proj, beside it after loading;
  * a vision encoder and its projector, split across the TP ranks like the language model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.core.errors import UsageError
from kvbench.specs.modelspec import DTYPE_BYTES, ModelSpec
from kvbench.specs.weightformat import WeightFormat, checkpoint_weight_format

VOCAB_PADDING = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
WEIGHT_CHOICES = ("auto", "bf16", "fp16", "fp32", "fp8", "int8", "int4")
_FLOAT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# --weights fp8/int8/int4 as vLLM stores them: fp8 per-tensor (--quantization fp8, scales negligible),
# int8 with a 32-bit scale per output channel (~0), int4 with a 16-bit scale per group of 128.
_QUANT = {"fp8": (1.0, 0), "int8": (1.0, 0), "int4": (0.5, 128)}


@dataclass(frozen=True)
class WeightPlan:
    """How the weights are stored: the linear layers' format, and the dtype everything else runs in."""

    fmt: WeightFormat
    dtype: str  # activation / unquantized-parameter dtype

    @property
    def label(self) -> str:
        return self.fmt.label


def weight_plan(spec: ModelSpec, weights: str = "auto", dtype: str | None = None) -> WeightPlan:
    """`--weights auto` is the config's dtype (float32 checkpoints run in bf16, as vLLM's --dtype auto) or its
    quantization_config; bf16/fp16/fp32 set the dtype; fp8/int8/int4 quantize the linear layers."""
    if weights not in WEIGHT_CHOICES:
        raise UsageError(f"unknown weight format {weights!r}; choose from: {', '.join(WEIGHT_CHOICES)}")
    act = dtype or spec.activation_dtype
    if act not in DTYPE_BYTES:
        raise UsageError(f"unknown dtype {act!r}; choose from: {', '.join(DTYPE_BYTES)}")
    if weights == "auto":
        return WeightPlan(checkpoint_weight_format(spec.source, spec.quantization, act), act)
    if weights in _FLOAT:
        act = _FLOAT[weights]
        return WeightPlan(WeightFormat(act, act, DTYPE_BYTES[act]), act)
    per, group = _QUANT[weights]
    label = f"{weights} + {act}"
    return WeightPlan(WeightFormat(weights, label, per + (2.0 / group if group else 0.0)), act)


def pp_layer_ranges(num_layers: int, pp: int) -> list[range]:
    """vLLM's get_pp_indices: even split, the remainder to the stages before the last, last first."""
    sizes = [num_layers // pp] * pp
    for i in range(num_layers % pp):
        sizes[-(i + 2) if pp > 1 else 0] += 1
    out, start = [], 0
    for n in sizes:
        out.append(range(start, start + n))
        start += n
    return out


def weight_bytes_per_rank(spec: ModelSpec, plan: WeightPlan, tp: int = 1, pp: int = 1) -> list[float]:
    """Bytes of weights on one GPU of each pipeline stage (TP ranks of a stage hold the same amount)."""
    if spec.num_layers < pp:
        raise UsageError(f"--pipeline-parallel-size {pp} exceeds the model's {spec.num_layers} layers")
    act = DTYPE_BYTES[plan.dtype]
    fmt = plan.fmt
    quantized = fmt.key not in DTYPE_BYTES

    def linear(n: int, experts: bool) -> float:
        # gpt-oss quantizes only its experts; other formats every linear layer
        if quantized and experts and fmt.expert_bytes_per_param:
            return n * fmt.expert_bytes_per_param
        if quantized and (experts or not fmt.experts_only):
            return n * fmt.bytes_per_param
        return n * act

    vocab_rows = math.ceil(spec.vocab_size / VOCAB_PADDING) * VOCAB_PADDING / tp
    table = vocab_rows * spec.hidden_size * act
    rope = (spec.max_position_embeddings or 0) * spec.rotary_dim * act
    mla_copy = 0.0
    if spec.is_mla:  # W_UK and W_UV: kv_lora_rank x heads x (nope + v) per layer, split by heads
        mla_copy = _mla_absorbed(spec) / tp * act
    kv_replicas = min(tp, spec.num_kv_heads) if not spec.is_mla else tp
    stages = []
    for s, layers in enumerate(pp_layer_ranges(spec.num_layers, pp)):
        total = rope
        for i in layers:
            p = spec.layer_params[i]
            attn = (p.attention - p.kv_proj) / tp + p.kv_proj / kv_replicas
            total += linear(attn, False) + linear(p.dense_mlp / tp, False) + linear(p.experts / tp, True)
            total += (p.router + p.norms) * act + mla_copy
        first, last = s == 0, s == pp - 1
        if first:
            total += table + spec.vision_params / tp * act
        if last:
            total += spec.hidden_size * act * (2 if spec.model_type == "phi" else 1)  # final norm
            if not spec.tie_word_embeddings or not first:
                total += table
        stages.append(total)
    return stages


def _mla_absorbed(spec: ModelSpec) -> float:
    """Parameters of W_UK + W_UV (= kv_b_proj) in one MLA layer, from the per-layer MLA count."""
    # kv_b_proj: kv_lora_rank x heads x (qk_nope + v_head); v_head is taken equal to qk_nope when unknown
    nope = spec.head_dim - (spec.qk_rope_head_dim or 0)
    return spec.kv_lora_rank * spec.num_attention_heads * 2 * nope
