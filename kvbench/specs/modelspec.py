"""What kvbench knows of a model: its layers as the KV cache sees them, its parameters as vLLM shards them."""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}


@dataclass(frozen=True)
class MambaState:
    """The recurrent state one Mamba2 or Gated DeltaNet layer keeps per request (vLLM's MambaSpec).

    Shapes as vllm/model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator builds them
    (mamba2_state_shape, gated_delta_net_state_shape): conv state (conv_len, conv_dim / TP) in the model
    dtype, SSM state (heads / TP, head_elems) in mamba_ssm_dtype (MambaStateDtypeCalculator)."""

    mixer: str  # "mamba2" or "gdn"
    conv_channels: int  # conv_dim before Mamba2's group replication
    conv_len: int  # conv_kernel - 1
    heads: int  # SSM heads, split over TP
    head_elems: int  # head_dim x state (Mamba2) or head_v_dim x head_k_dim (GDN)
    ssm_bytes: float | None = None  # mamba_ssm_dtype bytes; None: the model dtype
    n_groups: int = 0  # Mamba2 B/C groups, replicated up to TP (extra_groups_for_head_shards)
    group_channels: int = 0  # 2 x ssm_state_size per group
    tp: int = 1

    def bytes(self, act_bytes: float) -> float:
        """Bytes of one layer's state on one rank (MambaSpec.page_size_bytes before padding)."""
        groups = self.n_groups + (0 if not self.n_groups or self.n_groups % self.tp == 0 else self.tp - self.n_groups)
        conv_dim = self.conv_channels + groups * self.group_channels
        conv = conv_dim // self.tp * self.conv_len * act_bytes
        return conv + self.heads // self.tp * self.head_elems * (self.ssm_bytes or act_bytes)


@dataclass(frozen=True)
class LayerKind:
    """One layer as the KV cache sees it (one vLLM KVCacheSpec)."""

    # "full", "sliding", "chunked", "mla", "mamba" or "dsv4" (DeepSeek V4: several caches, kvbench.specs.dsv4_kv)
    kind: str
    window: int | None = None  # tokens: the sliding window, or the chunk of chunked-local attention
    kv_heads: int | None = None  # this layer's KV heads where they differ from the model's (Gemma 4 global)
    head_dim: int | None = None  # likewise
    index_bytes: int = 0  # DeepSeek V3.2 DSA indexer key per token (fp8 + fp32 scale), any KV dtype
    state: MambaState | None = None  # for "mamba"
    token_stride: int = 1  # DeepSeek V4 compressed layers: one cached entry per `token_stride` tokens
    latent: bool = False  # one vector of head_dim per token, no separate V (MLA-style), whole on every rank
    index_head_dim: int = 0  # DeepSeek V4 ratio-4 layers: the sparse indexer's key width (index_head_dim)

    @property
    def cached(self) -> bool:
        """False for layers with no cache of their own (Nemotron-H's MLP and MoE layers)."""
        return self.kind != "none"


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
    weight_bytes: float = 0.0  # whole model, one rank, as the checkpoint is stored (see kvbench.specs.weights)
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
    mtp_layers: int = 0  # MTP modules the config carries (mtp_num_hidden_layers / num_nextn_predict_layers)
    speculative_tokens: int = 0  # served with speculative decoding: tokens per step (Mamba state keeps as many pages)
    retained_tokens: int = 0  # sliding-window tokens kept beyond the window for a multi-module MTP drafter

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
        """Cached layers per distinct spec (vLLM groups layers by equal KVCacheSpec)."""
        counts: dict[LayerKind, int] = {}
        for layer in self.layers:
            if layer.cached:
                counts[layer] = counts.get(layer, 0) + 1
        return counts
