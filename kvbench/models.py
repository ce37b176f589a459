"""Model specs read from a Hugging Face config.json: what the KV cache and the weights need.

Any config.json path works; the shipped ones (kvbench/data/models.toml) are addressable by short name.
"""

from __future__ import annotations

import math
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


def catalog() -> dict:
    return load_toml("models.toml")


def by_hf_id(hf_id: str) -> str | None:
    """The short name of a shipped model whose Hugging Face id (or an alias) is `hf_id`, if any."""
    for name, entry in catalog().items():
        if hf_id.lower() in (i.lower() for i in [entry.get("hf_id", ""), *entry.get("hf_aliases", [])]):
            return name
    return None


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
    """config.json access that validates each field it hands out and names it in its error."""

    def __init__(self, raw: dict, source: str, section: str = ""):
        self.raw = raw
        self.source = source
        self.section = section  # "text_config." for the nested language model of a multimodal config

    def _bad(self, key: str, value, form: str) -> UsageError:
        return UsageError(f"{self.source}: config.json field '{self.section}{key}' must be {form}, got {value!r}")

    def get(self, key: str, default=None):
        value = self.raw.get(key, default)
        return default if value is None else value

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def need(self, key: str, why: str) -> int:
        """A required positive integer."""
        if self.raw.get(key) is None:
            raise UsageError(f"{self.source}: config.json lacks '{self.section}{key}' (needed for {why})")
        return self.int(key)

    def int(self, key: str, default: int | None = None, minimum: int = 1) -> int | None:
        """An optional integer >= minimum (JSON true/false and 4096.0 are not integers)."""
        value = self.raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._bad(key, value, "a positive integer" if minimum == 1 else f"an integer >= {minimum}")
        return value

    def number(self, key: str) -> float | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self._bad(key, value, "a positive number")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value

    def str(self, key: str, default: str) -> str:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._bad(key, value, "a string")
        return value

    def dict(self, key: str) -> dict:
        value = self.raw.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._bad(key, value, "a JSON object")
        return value

    def list(self, key: str) -> list:
        """An optional list of strings."""
        item = str  # the builtin here: in the class body `str` names the method above
        value = self.raw.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, item) and not isinstance(v, bool) for v in value):
            raise self._bad(key, value, "a list of strings")
        return value


# HF config defaults where a config leaves a field out (transformers' config classes).
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text"}


def from_config(raw: dict, name: str, source: str) -> ModelSpec:
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: config.json must hold a JSON object")
    top = _Config(raw, source)
    text = top.dict("text_config")  # multimodal configs nest the language model here
    cfg = _Config(text, source, "text_config.") if text else top
    num_layers = cfg.need("num_hidden_layers", "the layer count")
    hidden = cfg.need("hidden_size", "the head size and parameter count")
    num_heads = cfg.need("num_attention_heads", "the head size")
    # HF semantics: no num_key_value_heads means multi-head attention.
    num_kv_heads = cfg.int("num_key_value_heads", num_heads)
    head_dim = cfg.int("head_dim", hidden // num_heads)
    model_type = cfg.str("model_type", top.str("model_type", "unknown"))

    kv_lora_rank = cfg.int("kv_lora_rank")
    qk_rope = None
    if kv_lora_rank is not None:
        qk_rope = cfg.need("qk_rope_head_dim", "the MLA cache width")
        # MLA's query/key head is the no-RoPE part plus the RoPE part (192 for DeepSeek-V3).
        head_dim = cfg.need("qk_nope_head_dim", "the MLA head size") + qk_rope

    layers = _layer_kinds(cfg, num_layers, model_type, mla=kv_lora_rank is not None)
    config_dtype = cfg.str("torch_dtype", cfg.str("dtype", top.str("torch_dtype", top.str("dtype", "bfloat16"))))
    if config_dtype not in DTYPE_BYTES:
        raise UsageError(
            f"{source}: torch_dtype {config_dtype!r} not understood; expected one of: {', '.join(DTYPE_BYTES)}"
        )
    # vLLM's --dtype auto runs a float32 checkpoint in bfloat16 (vllm/config/model.py _resolve_auto_dtype).
    activation_dtype = "bfloat16" if config_dtype == "float32" else config_dtype

    vocab = cfg.need("vocab_size", "the embedding parameter count")
    tied = cfg.bool("tie_word_embeddings", top.bool("tie_word_embeddings", model_type in _TIED_BY_DEFAULT))
    layer_params, moe = _layer_params(cfg, model_type, num_layers, hidden, num_heads, num_kv_heads, head_dim)
    vision = _vision_params(top, hidden) if text else 0
    final_norm = hidden * (2 if model_type == "phi" else 1)
    params = {
        "embedding": vocab * hidden,
        "lm_head": 0 if tied else vocab * hidden + (vocab if model_type == "phi" else 0),
        "attention": sum(p.attention for p in layer_params),
        "dense_mlp": sum(p.dense_mlp for p in layer_params),
        "experts": sum(p.experts for p in layer_params),
        "router": sum(p.router for p in layer_params),
        "norms": sum(p.norms for p in layer_params) + final_norm,
    }
    if vision:
        params["vision"] = vision
    quant = cfg.dict("quantization_config") or top.dict("quantization_config")
    weight_format, weight_bytes = _weight_bytes(cfg, quant, params, DTYPE_BYTES[activation_dtype], activation_dtype)
    partial = cfg.number("partial_rotary_factor") or 1.0
    rope_dim = qk_rope if qk_rope else int(head_dim * partial)
    return ModelSpec(
        name=name,
        source=source,
        model_type=model_type,
        num_layers=num_layers,
        num_attention_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        layers=layers,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope,
        activation_dtype=activation_dtype,
        weight_format=weight_format,
        params=params,
        weight_bytes=weight_bytes,
        max_position_embeddings=cfg.int("max_position_embeddings"),
        # gpt-oss adds learned attention sinks, which some NVFP4 attention paths reject.
        attention_sinks=model_type == "gpt_oss",
        config_dtype=config_dtype,
        hidden_size=hidden,
        intermediate_size=cfg.int("intermediate_size", 0) or 0,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        layer_params=tuple(layer_params),
        vision_params=vision,
        rotary_dim=rope_dim,
        moe=moe,
        logits_soft_cap=cfg.number("final_logit_softcapping"),
        quantization=quant,
    )


def _layer_kinds(cfg: _Config, num_layers: int, model_type: str, mla: bool) -> tuple[LayerKind, ...]:
    if mla:
        return (LayerKind("mla"),) * num_layers
    window = cfg.int("sliding_window")
    layer_types = cfg.list("layer_types")
    if layer_types:
        if len(layer_types) != num_layers:
            raise UsageError(
                f"{cfg.source}: 'layer_types' lists {len(layer_types)} layers but 'num_hidden_layers' is {num_layers}"
            )
        if any(t == "sliding_attention" for t in layer_types) and not window:
            raise UsageError(
                f"{cfg.source}: config.json lacks 'sliding_window' (needed for its sliding_attention layers)"
            )
        return tuple(
            LayerKind("sliding", window) if t == "sliding_attention" else LayerKind("full") for t in layer_types
        )
    if not window or cfg.bool("use_sliding_window", True) is False:
        # Qwen2/3 configs carry a window but switch it off with use_sliding_window=false.
        return (LayerKind("full"),) * num_layers
    if model_type == "gemma2":  # vLLM gemma2.py: even layers slide, odd layers are global
        return tuple(LayerKind("sliding", window) if i % 2 == 0 else LayerKind("full") for i in range(num_layers))
    if model_type in ("gemma3", "gemma3_text"):  # every sliding_window_pattern-th layer is global
        pattern = cfg.int("sliding_window_pattern", 6)
        return tuple(
            LayerKind("full") if (i + 1) % pattern == 0 else LayerKind("sliding", window) for i in range(num_layers)
        )
    if "max_window_layers" in cfg.raw and "use_sliding_window" in cfg.raw:
        # Qwen2-style: layers from max_window_layers onward use the window.
        first = cfg.int("max_window_layers", num_layers, minimum=0)
        return tuple(LayerKind("sliding", window) if i >= first else LayerKind("full") for i in range(num_layers))
    return (LayerKind("sliding", window),) * num_layers


def _layer_params(
    cfg: _Config, model_type: str, num_layers: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[list[LayerParams], Moe | None]:
    """Parameters of each decoder layer, from the config alone (no weights needed)."""
    attn_bias = cfg.bool("attention_bias", model_type in ("qwen2_moe", "qwen2", "phi"))
    mlp_bias = cfg.bool("mlp_bias", model_type == "phi")

    if cfg.has("kv_lora_rank"):
        attention, kv_proj = _mla_params(cfg, hidden, num_heads), 0
    else:
        q, kv = num_heads * head_dim, num_kv_heads * head_dim
        attention, kv_proj = hidden * q + 2 * hidden * kv + q * hidden, 2 * hidden * kv
        if attn_bias:
            attention += q + 2 * kv + (hidden if model_type in ("gpt_oss", "phi") else 0)
        if model_type == "gpt_oss":
            attention += num_heads  # attention sinks
    norms = 2 * hidden
    if model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text") or cfg.bool("use_qk_norm", False):
        norms += 2 * head_dim  # q_norm, k_norm
    if model_type in ("gemma2", "gemma3", "gemma3_text"):
        norms += 2 * hidden  # pre- and post-feedforward norms
    if model_type == "phi":  # one LayerNorm (weight + bias) per layer: attention and MLP run in parallel
        norms = 2 * hidden

    inter = cfg.int("intermediate_size", 0) or 0
    if model_type == "phi":  # fc1 -> gelu -> fc2, no gate
        dense = 2 * hidden * inter + inter + hidden
    else:
        dense = 3 * hidden * inter + (2 * inter + hidden if mlp_bias else 0)

    n_routed = cfg.int("n_routed_experts")
    n_local = cfg.int("num_local_experts") or cfg.int("num_experts")
    layers: list[LayerParams] = []
    if n_routed:  # DeepSeek-style: shared + routed experts, the first k layers dense
        moe_inter = cfg.need("moe_intermediate_size", "the expert parameter count")
        shared = cfg.int("n_shared_experts", 0, minimum=0) * 3 * hidden * moe_inter
        first_dense = cfg.int("first_k_dense_replace", 0, minimum=0)
        router = hidden * n_routed + (n_routed if cfg.get("topk_method") == "noaux_tc" else 0)
        moe = Moe(n_routed, cfg.need("num_experts_per_tok", "the MoE activation size"), moe_inter)
        for i in range(num_layers):
            if i < first_dense:
                layers.append(LayerParams(attention, kv_proj, dense, 0, 0, norms))
            else:
                layers.append(LayerParams(attention, kv_proj, shared, n_routed * 3 * hidden * moe_inter, router, norms))
        return layers, moe
    if n_local:
        top_k = cfg.need("num_experts_per_tok", "the MoE activation size")
        if model_type == "gpt_oss":  # fused gate_up and down projections, each with a bias
            experts = n_local * (hidden * 2 * inter + 2 * inter + inter * hidden + hidden)
            return [LayerParams(attention, kv_proj, 0, experts, hidden * n_local + n_local, norms)] * num_layers, Moe(
                n_local, top_k, inter
            )
        moe_inter = cfg.int("moe_intermediate_size", inter)
        experts = n_local * 3 * hidden * moe_inter
        router = hidden * n_local
        shared = 0
        if cfg.has("shared_expert_intermediate_size"):  # Qwen2-MoE: a shared expert and its 1-wide gate
            shared = 3 * hidden * cfg.int("shared_expert_intermediate_size") + hidden
        if model_type == "llama4_text":  # a shared expert of the expert width; dense layers between MoE layers
            shared = 3 * hidden * moe_inter
            step = cfg.int("interleave_moe_layer_step", 1)
            dense_inter = cfg.int("intermediate_size_mlp", inter)
            for i in range(num_layers):
                if (i + 1) % step == 0:
                    layers.append(LayerParams(attention, kv_proj, shared, experts, router, norms))
                else:
                    layers.append(LayerParams(attention, kv_proj, 3 * hidden * dense_inter, 0, 0, norms))
            return layers, Moe(n_local, top_k, moe_inter)
        return [LayerParams(attention, kv_proj, shared, experts, router, norms)] * num_layers, Moe(
            n_local, top_k, moe_inter
        )
    return [LayerParams(attention, kv_proj, dense, 0, 0, norms)] * num_layers, None


def _mla_params(cfg: _Config, hidden: int, num_heads: int) -> int:
    kv_lora = cfg.need("kv_lora_rank", "MLA")
    rope = cfg.need("qk_rope_head_dim", "MLA")
    nope = cfg.need("qk_nope_head_dim", "the MLA parameter count")
    v_dim = cfg.need("v_head_dim", "the MLA parameter count")
    q_lora = cfg.int("q_lora_rank")
    if q_lora:
        q = hidden * q_lora + q_lora + q_lora * num_heads * (nope + rope)
    else:
        q = hidden * num_heads * (nope + rope)
    kv = hidden * (kv_lora + rope) + kv_lora + kv_lora * num_heads * (nope + v_dim)
    return q + kv + num_heads * v_dim * hidden


def _vision_params(top: _Config, text_hidden: int) -> int:
    """A ViT-style image encoder (SigLIP, MoonViT, Llama 4's) and its projector into the language model."""
    vc = _Config(top.dict("vision_config"), top.source, "vision_config.")
    if not vc.raw:
        return 0
    h = vc.need("hidden_size", "the vision encoder parameter count")
    inter = vc.need("intermediate_size", "the vision encoder parameter count")
    layers = vc.need("num_hidden_layers", "the vision encoder parameter count")
    patch = vc.int("patch_size", 14)
    # per layer: q/k/v/o with biases, fc1/fc2 with biases, two LayerNorms (weight + bias)
    per_layer = 4 * h * h + 4 * h + 2 * h * inter + inter + h + 4 * h
    encoder = layers * per_layer + 3 * patch * patch * h + h + 2 * h
    image = vc.int("image_size")
    if image:  # learned position embeddings, one per patch
        encoder += (image // patch) ** 2 * h
    elif vc.int("init_pos_emb_height"):
        encoder += vc.int("init_pos_emb_height") * vc.int("init_pos_emb_width", 1) * h
    model_type = top.str("model_type", "")
    if model_type == "gemma3":  # mm_input_projection + soft-embedding norm
        projector = h * text_hidden + h
    elif model_type == "llava_next":  # 2-layer MLP over the concatenated feature layers, plus image_newline
        feature_layers = top.raw.get("vision_feature_layer")
        k = len(feature_layers) if isinstance(feature_layers, list) else 1
        projector = k * h * text_hidden + text_hidden + text_hidden * text_hidden + text_hidden + text_hidden
    elif model_type == "kimi_vl":  # LayerNorm + 2-layer MLP over 2x2 merged patches
        merged = 4 * h
        projector = 2 * h + merged * merged + merged + merged * text_hidden + text_hidden
    elif model_type == "llama4":  # vision adapter MLP (pixel-shuffled) + projector to the text width
        out = vc.int("vision_output_dim", h)
        proj_in = vc.int("projector_input_dim", out)
        shuffled = int(h / (vc.number("pixel_shuffle_ratio") or 1.0) ** 2)
        projector = shuffled * proj_in + proj_in * out + out * text_hidden
    else:
        projector = h * text_hidden
    return encoder + projector


def _weight_bytes(
    cfg: _Config, quant: dict, params: dict[str, int], act_bytes: float, act_dtype: str
) -> tuple[str, float]:
    """Bytes the weights take in memory as the checkpoint stores them (quantization_config when present)."""
    total = float(sum(params.values()))
    linear = params["attention"] + params["dense_mlp"] + params["experts"]
    fmt = checkpoint_weight_format(cfg.source, quant, act_dtype)
    if fmt.key == act_dtype:
        return act_dtype, total * act_bytes
    quantized = params["experts"] if fmt.experts_only else linear
    return fmt.label, quantized * fmt.bytes_per_param + (total - quantized) * act_bytes


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores its linear layers: bytes per parameter, scales included."""

    key: str  # "bfloat16", "fp8", "int8", "int4", "mxfp4"...
    label: str
    bytes_per_param: float
    experts_only: bool = False  # gpt-oss: only the MoE experts are quantized


def checkpoint_weight_format(source: str, quant: dict, act_dtype: str) -> WeightFormat:
    """The weight format a config's quantization_config describes (or the activation dtype without one)."""
    method = str(quant.get("quant_method", "")).lower()
    if not method:
        return WeightFormat(act_dtype, act_dtype, DTYPE_BYTES[act_dtype])
    if method == "fp8":
        # FP8 with one FP32 scale per 128x128 block; embeddings, norms, router stay 16-bit.
        block = quant.get("weight_block_size") or [128, 128]
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
    bits = quant.get("bits") or quant.get("w_bit")
    if bits in (2, 3, 4, 8):  # GPTQ/AWQ-style integer weights with a 16-bit scale per group
        group = quant.get("group_size") or quant.get("q_group_size") or 128
        return WeightFormat(f"int{bits}", f"int{bits} + {act_dtype}", bits / 8 + 2.0 / group)
    raise UsageError(
        f"{source}: quantization_config quant_method {method!r} is not modelled; "
        "supported: fp8, mxfp4, compressed-tensors int4/int8, or any method with 'bits'"
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


def spec_for(*candidates: str | None) -> ModelSpec | None:
    """The capacity model's view of a model named any way kvbench meets one: the embedded tiny model by its
    name, a shipped short name, a local folder or config.json; the first candidate that resolves wins, None
    when none does (a hub id whose config is not on this disk has no model-side prediction). The one lookup
    the runner, the dashboards and the nightly estimate share."""
    from kvbench.tinymodel import build as tinymodel

    for candidate in candidates:
        if not candidate:
            continue
        if candidate == tinymodel.NAME:
            return from_config(dict(tinymodel.CONFIG), name=tinymodel.NAME, source="kvbench.tinymodel.build.CONFIG")
        path = Path(candidate).expanduser()
        if candidate in catalog() or (path / "config.json").is_file() or path.is_file():
            try:
                return load_model(candidate)
            except UsageError:
                continue
    return None
