"""Model specs read from a Hugging Face config.json: what the KV cache and the weights need.

Any config.json path works; the shipped ones (kvbench/data/models.toml) are addressable by short name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvbench.datafiles import data_path, load_toml, read_json
from kvbench.errors import UsageError, unknown_choice

DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}


@dataclass(frozen=True)
class LayerKind:
    """One attention layer as the KV cache sees it."""

    kind: str  # "full", "sliding" or "mla"
    window: int | None = None  # tokens, for "sliding"


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
    activation_dtype: str  # torch_dtype: what vLLM's `auto` KV cache stores
    weight_format: str  # e.g. "bfloat16", "fp8 (block-scaled) + bfloat16"
    params: dict[str, int] = field(default_factory=dict)  # component -> parameter count
    weight_bytes: float = 0.0
    max_position_embeddings: int | None = None
    attention_sinks: bool = False

    @property
    def param_count(self) -> int:
        return sum(self.params.values())

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def activation_bytes(self) -> float:
        return DTYPE_BYTES[self.activation_dtype]

    def layer_counts(self) -> dict[LayerKind, int]:
        counts: dict[LayerKind, int] = {}
        for layer in self.layers:
            counts[layer] = counts.get(layer, 0) + 1
        return counts


def catalog() -> dict:
    return load_toml("models.toml")


def load_model(name_or_path: str) -> ModelSpec:
    """A shipped short name, a config.json path, or a directory holding config.json."""
    entries = catalog()
    if name_or_path in entries:
        entry = entries[name_or_path]
        return from_config(read_json(data_path(entry["config"])), name=name_or_path, source=entry["source"])
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return from_config(read_json(path), name=path.parent.name or str(path), source=str(path))
    raise unknown_choice("model", name_or_path, entries, extra=", or a path to a config.json")


class _Config:
    """config.json access that names the missing field in its error."""

    def __init__(self, raw: dict, source: str):
        # Multimodal configs nest the language model under text_config.
        self.raw = raw.get("text_config") or raw
        self.source = source

    def get(self, key: str, default=None):
        value = self.raw.get(key, default)
        return default if value is None else value

    def need(self, key: str, why: str):
        value = self.raw.get(key)
        if value is None:
            raise UsageError(f"{self.source}: config.json lacks '{key}' (needed for {why})")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise UsageError(f"{self.source}: config.json field '{key}' must be a positive number, got {value!r}")
        return value


def from_config(raw: dict, name: str, source: str) -> ModelSpec:
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: config.json must hold a JSON object")
    cfg = _Config(raw, source)
    num_layers = int(cfg.need("num_hidden_layers", "the layer count"))
    hidden = int(cfg.need("hidden_size", "the head size and parameter count"))
    num_heads = int(cfg.need("num_attention_heads", "the head size"))
    # HF semantics: no num_key_value_heads means multi-head attention.
    num_kv_heads = int(cfg.get("num_key_value_heads", num_heads))
    head_dim = int(cfg.get("head_dim", hidden // num_heads))
    model_type = str(cfg.get("model_type", "unknown"))

    kv_lora_rank = cfg.get("kv_lora_rank")
    qk_rope = None
    if kv_lora_rank is not None:
        qk_rope = cfg.need("qk_rope_head_dim", "the MLA cache width")
        # MLA's query/key head is the no-RoPE part plus the RoPE part (192 for DeepSeek-V3).
        head_dim = int(cfg.need("qk_nope_head_dim", "the MLA head size")) + int(qk_rope)

    layers = _layer_kinds(cfg, num_layers, mla=kv_lora_rank is not None)
    activation_dtype = str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16")))
    if activation_dtype not in DTYPE_BYTES:
        raise UsageError(f"{source}: torch_dtype {activation_dtype!r} not understood; expected one of: {', '.join(DTYPE_BYTES)}")

    params = _count_params(cfg, num_layers, hidden, num_heads, num_kv_heads, head_dim)
    weight_format, weight_bytes = _weight_bytes(cfg, params, DTYPE_BYTES[activation_dtype], activation_dtype)
    return ModelSpec(
        name=name,
        source=source,
        model_type=model_type,
        num_layers=num_layers,
        num_attention_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        layers=layers,
        kv_lora_rank=int(kv_lora_rank) if kv_lora_rank is not None else None,
        qk_rope_head_dim=int(qk_rope) if qk_rope is not None else None,
        activation_dtype=activation_dtype,
        weight_format=weight_format,
        params=params,
        weight_bytes=weight_bytes,
        max_position_embeddings=cfg.get("max_position_embeddings"),
        # gpt-oss adds learned attention sinks, which some NVFP4 attention paths reject.
        attention_sinks=model_type == "gpt_oss",
    )


def _layer_kinds(cfg: _Config, num_layers: int, mla: bool) -> tuple[LayerKind, ...]:
    if mla:
        return (LayerKind("mla"),) * num_layers
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if layer_types:
        if len(layer_types) != num_layers:
            raise UsageError(f"{cfg.source}: 'layer_types' lists {len(layer_types)} layers but 'num_hidden_layers' is {num_layers}")
        if any(t == "sliding_attention" for t in layer_types) and not window:
            raise UsageError(f"{cfg.source}: config.json lacks 'sliding_window' (needed for its sliding_attention layers)")
        return tuple(LayerKind("sliding", int(window)) if t == "sliding_attention" else LayerKind("full") for t in layer_types)
    if not window or cfg.get("use_sliding_window", True) is False:
        # Qwen2/3 configs carry a window but switch it off with use_sliding_window=false.
        return (LayerKind("full"),) * num_layers
    if "max_window_layers" in cfg.raw and "use_sliding_window" in cfg.raw:
        # Qwen2-style: layers from max_window_layers onward use the window.
        first = int(cfg.get("max_window_layers", num_layers))
        return tuple(LayerKind("sliding", int(window)) if i >= first else LayerKind("full") for i in range(num_layers))
    return (LayerKind("sliding", int(window)),) * num_layers


def _count_params(cfg: _Config, num_layers: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int) -> dict[str, int]:
    """Parameter count by component, from the config alone (no weights needed)."""
    vocab = int(cfg.need("vocab_size", "the embedding parameter count"))
    attn_bias = bool(cfg.get("attention_bias", False))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    model_type = str(cfg.get("model_type", ""))

    if cfg.get("kv_lora_rank") is not None:
        attention = _mla_params(cfg, hidden, num_heads)
    else:
        q, kv = num_heads * head_dim, num_kv_heads * head_dim
        attention = hidden * q + 2 * hidden * kv + q * hidden
        if attn_bias:
            attention += q + 2 * kv + (hidden if model_type == "gpt_oss" else 0)
        if model_type in ("qwen3", "qwen3_moe"):
            attention += 2 * head_dim  # q_norm, k_norm
        if model_type == "gpt_oss":
            attention += num_heads  # attention sinks

    dense_mlp_layers, moe_layers, dense_mlp, experts, router = _mlp_params(cfg, num_layers, hidden, mlp_bias)
    norms = 2 * hidden * num_layers + hidden
    embed = vocab * hidden
    return {
        "embedding": embed,
        "lm_head": 0 if cfg.get("tie_word_embeddings", False) else embed,
        "attention": attention * num_layers,
        "dense_mlp": dense_mlp * dense_mlp_layers,
        "experts": experts * moe_layers,
        "router": router * moe_layers,
        "norms": norms,
    }


def _mla_params(cfg: _Config, hidden: int, num_heads: int) -> int:
    kv_lora = int(cfg.need("kv_lora_rank", "MLA"))
    rope = int(cfg.need("qk_rope_head_dim", "MLA"))
    nope = int(cfg.need("qk_nope_head_dim", "the MLA parameter count"))
    v_dim = int(cfg.need("v_head_dim", "the MLA parameter count"))
    q_lora = cfg.get("q_lora_rank")
    if q_lora:
        q = hidden * q_lora + q_lora + q_lora * num_heads * (nope + rope)
    else:
        q = hidden * num_heads * (nope + rope)
    kv = hidden * (kv_lora + rope) + kv_lora + kv_lora * num_heads * (nope + v_dim)
    return q + kv + num_heads * v_dim * hidden


def _mlp_params(cfg: _Config, num_layers: int, hidden: int, mlp_bias: bool):
    """(dense layers, MoE layers, dense MLP per layer, experts per MoE layer, router per MoE layer)."""
    inter = int(cfg.need("intermediate_size", "the MLP parameter count"))
    dense = 3 * hidden * inter + (2 * inter + hidden if mlp_bias else 0)
    model_type = str(cfg.get("model_type", ""))
    n_routed = cfg.get("n_routed_experts")
    if n_routed:  # DeepSeek-style: shared + routed experts, the first k layers dense
        moe_inter = int(cfg.need("moe_intermediate_size", "the expert parameter count"))
        n_shared = int(cfg.get("n_shared_experts", 0))
        first_dense = int(cfg.get("first_k_dense_replace", 0))
        experts = (int(n_routed) + n_shared) * 3 * hidden * moe_inter
        router = hidden * int(n_routed) + (int(n_routed) if cfg.get("topk_method") == "noaux_tc" else 0)
        return first_dense, num_layers - first_dense, dense, experts, router
    n_local = cfg.get("num_local_experts") or cfg.get("num_experts")
    if n_local:
        n_local = int(n_local)
        if model_type == "gpt_oss":  # fused gate_up and down projections, each with a bias
            experts = n_local * (hidden * 2 * inter + 2 * inter + inter * hidden + hidden)
            router = hidden * n_local + n_local
        else:  # Mixtral / Qwen-MoE style
            moe_inter = int(cfg.get("moe_intermediate_size", inter))
            experts = n_local * 3 * hidden * moe_inter
            router = hidden * n_local
        return 0, num_layers, dense, experts, router
    return num_layers, 0, dense, 0, 0


def _weight_bytes(cfg: _Config, params: dict[str, int], act_bytes: float, act_dtype: str) -> tuple[str, float]:
    """Bytes the weights take in memory, from the config's quantization_config when present."""
    total = float(sum(params.values()))
    quant = cfg.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if not method:
        return act_dtype, total * act_bytes
    if method == "fp8":
        # Linear layers in FP8 with one FP32 scale per 128x128 block; embeddings, norms, router stay 16-bit.
        block = quant.get("weight_block_size") or [128, 128]
        per_param = 1.0 + 4.0 / (block[0] * block[1])
        linear = params["attention"] + params["dense_mlp"] + params["experts"]
        return f"fp8 (block-scaled) + {act_dtype}", linear * per_param + (total - linear) * act_bytes
    if method == "mxfp4":
        # gpt-oss: MoE experts in MXFP4 (4 bits + one E8M0 scale per 32 values); the rest 16-bit.
        return f"mxfp4 experts + {act_dtype}", params["experts"] * 4.25 / 8 + (total - params["experts"]) * act_bytes
    bits = quant.get("bits") or quant.get("w_bit")
    if bits:  # GPTQ/AWQ-style integer weights, group scales ignored
        linear = params["attention"] + params["dense_mlp"] + params["experts"]
        return f"int{bits} + {act_dtype}", linear * bits / 8 + (total - linear) * act_bytes
    raise UsageError(
        f"{cfg.source}: quantization_config quant_method {method!r} is not modelled; "
        "supported: fp8, mxfp4, or any method with 'bits'"
    )


def describe_layers(model: ModelSpec) -> str:
    parts = []
    for kind, count in model.layer_counts().items():
        if kind.kind == "sliding":
            parts.append(f"{count} sliding-window ({kind.window} tok)")
        elif kind.kind == "mla":
            parts.append(f"{count} MLA (latent {model.kv_lora_rank}+{model.qk_rope_head_dim})")
        else:
            parts.append(f"{count} full")
    return ", ".join(parts)

