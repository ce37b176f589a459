"""A Hugging Face config.json read into a ModelSpec: every field validated and named in its error, the
transformers defaults where a config leaves one out."""

from __future__ import annotations

import math

from kvbench.core.errors import UsageError
from kvbench.specs.layerspec import layer_kinds
from kvbench.specs.modelspec import DTYPE_BYTES, LayerParams, ModelSpec, Moe
from kvbench.specs.weightformat import checkpoint_weight_format


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

    layers = layer_kinds(cfg, num_layers, model_type, mla=kv_lora_rank is not None)
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
    layer_params = _gdn_params(cfg, hidden, num_heads * head_dim, layers, layer_params)
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
    params.update({"vision": vision} if vision else {})
    quant = _quantization(cfg, top, model_type)
    weight_format, weight_bytes = _weight_bytes(cfg, quant, params, DTYPE_BYTES[activation_dtype], activation_dtype)
    rope_dim = qk_rope if qk_rope else int(head_dim * (cfg.number("partial_rotary_factor") or 1.0))
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
        mtp_layers=_mtp_layers(cfg),
    )


def _quantization(cfg: _Config, top: _Config, model_type: str) -> dict:
    """The quantization_config; DeepSeek V4's expert_dtype (default "fp4") joins it: it picks the routed experts'
    format (vllm/models/deepseek_v4/quant_config.py)."""
    quant = cfg.dict("quantization_config") or top.dict("quantization_config")
    if model_type == "deepseek_v4" and quant:
        quant = {**quant, "expert_dtype": cfg.str("expert_dtype", "fp4")}
    return quant


def _mtp_layers(cfg: _Config) -> int:
    """MTP modules the checkpoint carries (Qwen3.5/3.6: mtp_num_hidden_layers; DeepSeek, Qwen3-Next:
    num_nextn_predict_layers); vLLM's MTP drafter loads them (kvbench.specs.speculative)."""
    return cfg.int("mtp_num_hidden_layers", 0, minimum=0) or cfg.int("num_nextn_predict_layers", 0, minimum=0) or 0


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

    if model_type == "nemotron_h":
        return _nemotron_h_params(cfg, hidden, attention, kv_proj)
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
        top_k = cfg.int("top_k_experts") or cfg.need("num_experts_per_tok", "the MoE activation size")
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


def _gdn_params(cfg: _Config, hidden: int, q_width: int, layers, params: list[LayerParams]) -> list[LayerParams]:
    """Qwen3-Next / Qwen3.5 (vllm/model_executor/models/qwen3_next.py): Gated DeltaNet layers replace attention
    with in_proj_qkvz + in_proj_ba, a depthwise conv, A_log / dt_bias, a gated norm and out_proj; the full
    attention layers' q_proj is doubled by the output gate. Other models' parameters come back unchanged."""
    if not cfg.has("linear_num_value_heads"):
        return params
    nk, nv = cfg.int("linear_num_key_heads", 1), cfg.int("linear_num_value_heads", 1)
    dk, dv = cfg.int("linear_key_head_dim", 1), cfg.int("linear_value_head_dim", 1)
    conv_dim = 2 * nk * dk + nv * dv
    gdn = hidden * (conv_dim + nv * dv) + hidden * 2 * nv + conv_dim * cfg.int("linear_conv_kernel_dim", 4)
    gdn += 2 * nv + dv + nv * dv * hidden
    out = []
    for kind, p in zip(layers, params, strict=True):
        if kind.kind == "mamba":
            out.append(LayerParams(gdn, 0, p.dense_mlp, p.experts, p.router, p.norms))
        else:
            out.append(
                LayerParams(p.attention + hidden * q_width, p.kv_proj, p.dense_mlp, p.experts, p.router, p.norms)
            )
    return out


def _nemotron_h_params(cfg: _Config, hidden: int, attention: int, kv_proj: int) -> tuple[list[LayerParams], Moe | None]:
    """One mixer per layer by hybrid_override_pattern (vllm/model_executor/models/nemotron_h.py): M Mamba2,
    * attention, - a non-gated relu2 MLP (2 matrices), E routed + shared non-gated experts; one norm each."""
    inter = cfg.int("intermediate_size", 0) or 0
    heads = cfg.int("mamba_num_heads", 1)
    m_inter = heads * cfg.int("mamba_head_dim", 1)
    state, groups = cfg.int("ssm_state_size", 1), cfg.int("n_groups", 1)
    conv_dim = m_inter + 2 * groups * state
    # in_proj (z, x, B, C, dt), conv1d (+ bias), A / D / dt_bias, gated norm, out_proj
    mamba = hidden * (m_inter + conv_dim + heads) + conv_dim * (cfg.int("conv_kernel", 4) + 1) + 3 * heads
    mamba += m_inter + m_inter * hidden
    n = cfg.int("n_routed_experts", 0, minimum=0) or 0
    moe_inter = cfg.int("moe_intermediate_size", inter)
    shared = (
        cfg.int("n_shared_experts", 0, minimum=0)
        * 2
        * hidden
        * cfg.int("moe_shared_expert_intermediate_size", 0, minimum=0)
    )
    out = []
    for c in cfg.str("hybrid_override_pattern", ""):
        if c == "M":
            out.append(LayerParams(mamba, 0, 0, 0, 0, hidden))
        elif c == "*":
            out.append(LayerParams(attention, kv_proj, 0, 0, 0, hidden))
        elif c == "-":
            out.append(LayerParams(0, 0, 2 * hidden * inter, 0, 0, hidden))
        else:
            out.append(LayerParams(0, 0, shared, n * 2 * hidden * moe_inter, hidden * n + n, hidden))
    moe = Moe(n, cfg.need("num_experts_per_tok", "the MoE activation size"), moe_inter) if n else None
    return out, moe


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
    # Qwen3.5/3.6 VL name the depth `depth`
    layers = vc.int("depth") or vc.need("num_hidden_layers", "the vision encoder parameter count")
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
    if fmt.expert_bytes_per_param:
        experts = params["experts"]
        rest = (quantized - experts) * fmt.bytes_per_param + (total - quantized) * act_bytes
        return fmt.label, experts * fmt.expert_bytes_per_param + rest
    return fmt.label, quantized * fmt.bytes_per_param + (total - quantized) * act_bytes
