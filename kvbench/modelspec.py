"""What kvbench knows of a model: its layers as the KV cache sees them, its parameters as vLLM shards them."""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}


@dataclass(frozen=True)
class LayerKind:
    """One attention layer as the KV cache sees it."""

    kind: str  # "full", "sliding" or "mla"
    window: int | None = None  # tokens, for "sliding"


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer, by how vLLM shards them across tensor-parallel ranks."""

    attention: int  # q/k/v/o (or MLA) projections: split across TP ranks
    kv_proj: int  # the k/v part of `attention`: replicated once TP exceeds the KV-head count
    dense_mlp: int  # dense MLP, incl. shared experts: split across TP ranks
    experts: int  # routed experts: split across TP ranks (each expert's intermediate dim)
    router: int  # replicated
    norms: int  # replicated (incl. biases kept whole)

    @property
    def total(self) -> int:
        return self.attention + self.dense_mlp + self.experts + self.router + self.norms

    @property
    def linear(self) -> int:
        """What a weight-quantization method converts: the linear layers (not norms or the router)."""
        return self.attention + self.dense_mlp + self.experts


@dataclass(frozen=True)
class Moe:
    num_experts: int
    top_k: int
    intermediate: int  # per expert


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    layers: tuple[LayerKind, ...]
    kv_lora_rank: int | None  # MLA latent width; None for ordinary attention
    qk_rope_head_dim: int | None
    activation_dtype: str  # the dtype vLLM runs with `--dtype auto` (its `auto` KV cache stores this)
    weight_format: str  # e.g. "bfloat16", "fp8 (block-scaled) + bfloat16"
    params: dict[str, int] = field(default_factory=dict)  # component -> parameter count
    weight_bytes: float = 0.0  # whole model, one rank, as the checkpoint is stored (see kvbench.weights)
    max_position_embeddings: int | None = None
    attention_sinks: bool = False
    config_dtype: str = "bfloat16"  # torch_dtype as the config states it
    hidden_size: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    tie_word_embeddings: bool = False
    layer_params: tuple[LayerParams, ...] = ()
    vision_params: int = 0  # multimodal encoder + projector
    rotary_dim: int = 0
    moe: Moe | None = None
    logits_soft_cap: float | None = None  # final-logit soft-capping (Gemma 2): more copies of the logits
    quantization: dict = field(default_factory=dict)  # the config's quantization_config

    @property
    def param_count(self) -> int:
        return sum(self.params.values())

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_multimodal(self) -> bool:
        return self.vision_params > 0

    @property
    def activation_bytes(self) -> float:
        return DTYPE_BYTES[self.activation_dtype]

    def layer_counts(self) -> dict[LayerKind, int]:
        counts: dict[LayerKind, int] = {}
        for layer in self.layers:
            counts[layer] = counts.get(layer, 0) + 1
        return counts
