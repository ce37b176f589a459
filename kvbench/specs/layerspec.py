"""Each decoder layer's KV-cache spec from a Hugging Face config, as vLLM builds one per layer.

Full attention, sliding window (`sliding_window` + `layer_types`, Gemma 2/3 and gpt-oss patterns),
chunked local attention (Llama 4 `attention_chunk_size`, every 4th layer global), MLA (one latent of
kv_lora_rank + qk_rope_head_dim, whole on every TP rank; DeepSeek V3.2's DSA indexer key beside it),
Mamba2 (Nemotron-H `hybrid_override_pattern`) and Gated DeltaNet (Qwen3-Next / Qwen3.5 `layer_types` or
`full_attention_interval`) recurrent state. MLP/MoE-only layers cache nothing (kind "none").
"""

from __future__ import annotations

from kvbench.core.errors import UsageError
from kvbench.specs.modelspec import DTYPE_BYTES, LayerKind, MambaState

# vllm/model_executor/models/deepseek_v2.py DeepseekV32IndexerCache: head_dim + head_dim // 128 * 4 bytes
# (fp8 key + one fp32 scale per 128 values), stored as uint8 whatever --kv-cache-dtype says.
INDEXER_QUANT_BLOCK = 128


# The closed set of `layer_types` values kvbench sizes, and what each needs besides (vLLM builds one KV spec per
# kind: FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec for GDN and Mamba2).
GDN_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
MAMBA2_FIELDS = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size")
LAYER_TYPES = {
    "full_attention": (),
    "sliding_attention": ("sliding_window",),
    "chunked_attention": ("attention_chunk_size",),
    "linear_attention": GDN_FIELDS,
    "mamba": MAMBA2_FIELDS,
}


def layer_kinds(cfg, num_layers: int, model_type: str, mla: bool) -> tuple[LayerKind, ...]:
    """`cfg`: hfconfig._Config of the language model (text_config where nested). A config in which no layer
    keeps a cache (no attention, no recurrent state) is refused: there is nothing to size."""
    kinds = _layer_kinds(cfg, num_layers, model_type, mla)
    if not any(k.cached for k in kinds):
        raise UsageError(
            f"{cfg.source}: no layer of this config keeps a KV cache or a recurrent state "
            "(every layer is an MLP or MoE block); kvbench has nothing to size"
        )
    return kinds


def _layer_kinds(cfg, num_layers: int, model_type: str, mla: bool) -> tuple[LayerKind, ...]:
    if mla:
        index_dim = cfg.int("index_head_dim") if cfg.has("index_topk") else None
        index = index_dim + index_dim // INDEXER_QUANT_BLOCK * 4 if index_dim else 0
        return (LayerKind("mla", latent=True, index_bytes=index),) * num_layers
    if cfg.has("compress_ratios"):
        return _deepseek_v4(cfg, num_layers)
    if cfg.has("hybrid_override_pattern"):
        return _nemotron_h(cfg, num_layers)
    if "layer_types" in cfg.raw and cfg.raw["layer_types"] is not None:
        return _from_layer_types(cfg, cfg.list("layer_types"), num_layers)
    if cfg.has("linear_num_value_heads"):  # Qwen3-Next: Gated DeltaNet + every full_attention_interval-th global
        every = cfg.int("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(num_layers)]
        return _from_layer_types(cfg, types, num_layers)
    if cfg.has("attention_chunk_size"):
        return _llama4(cfg, num_layers)
    window = cfg.int("sliding_window")
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


def _from_layer_types(cfg, layer_types: list[str], num_layers: int) -> tuple[LayerKind, ...]:
    """One spec per listed layer, from the closed set LAYER_TYPES; an unknown kind, or a known one whose fields the
    config lacks, is one error naming them (never counted as full attention)."""
    choices = ", ".join(f"{k} (needs {', '.join(v)})" if v else k for k, v in LAYER_TYPES.items())
    if not layer_types:
        raise UsageError(f"{cfg.source}: config.json field '{cfg.section}layer_types' is empty; kinds: {choices}")
    _checked(cfg, layer_types, num_layers)
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        where = {t: [i for i, v in enumerate(layer_types) if v == t] for t in unknown}
        named = "; ".join(f"{t!r} (layers {_span(where[t])})" for t in unknown)
        raise UsageError(
            f"{cfg.source}: config.json field '{cfg.section}layer_types' has kinds kvbench does not size: {named}; "
            f"kinds: {choices}"
        )
    for kind in dict.fromkeys(layer_types):
        lacking = [f for f in LAYER_TYPES[kind] if not cfg.has(f)]
        if lacking:
            raise UsageError(
                f"{cfg.source}: 'layer_types' lists {kind} layers but config.json lacks "
                + ", ".join(f"'{cfg.section}{f}'" for f in lacking)
                + f" (needed for {kind})"
            )
    built = {
        "full_attention": lambda: LayerKind(
            "full", kv_heads=cfg.int("num_global_key_value_heads"), head_dim=cfg.int("global_head_dim")
        ),
        "sliding_attention": lambda: LayerKind("sliding", cfg.int("sliding_window")),
        "chunked_attention": lambda: LayerKind("chunked", cfg.int("attention_chunk_size")),
        "linear_attention": lambda: LayerKind("mamba", state=_gdn_state(cfg)),
        "mamba": lambda: LayerKind("mamba", state=_mamba2_state(cfg)),
    }
    specs = {kind: built[kind]() for kind in dict.fromkeys(layer_types)}
    return tuple(specs[t] for t in layer_types)


def _span(indices: list[int]) -> str:
    shown = ", ".join(map(str, indices[:6]))
    return shown + (f", ... ({len(indices)} in all)" if len(indices) > 6 else "")


def _checked(cfg, layer_types: list[str], num_layers: int) -> list[str]:
    if len(layer_types) != num_layers:
        raise UsageError(
            f"{cfg.source}: 'layer_types' lists {len(layer_types)} layers but 'num_hidden_layers' is {num_layers}"
        )
    return layer_types


def _ssm_bytes(cfg, default: str = "") -> float | None:
    # vllm/model_executor/models/config.py Qwen3_5ForConditionalGenerationConfig: the config's
    # mamba_ssm_dtype becomes cache_config.mamba_ssm_cache_dtype; absent, "auto" = the model dtype.
    # NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype: the config's mamba_ssm_cache_dtype, else float32.
    name = cfg.str("mamba_ssm_dtype", "") or cfg.str("mamba_ssm_cache_dtype", default)
    if name and name not in DTYPE_BYTES:
        raise UsageError(
            f"{cfg.source}: mamba_ssm_dtype {name!r} not understood; expected one of: {', '.join(DTYPE_BYTES)}"
        )
    return DTYPE_BYTES[name] if name else None


def _gdn_state(cfg) -> MambaState:
    """mamba_utils.py gated_delta_net_state_shape: conv (k-1, (2 nk dk + nv dv)/TP), ssm (nv/TP, dv, dk)."""
    nk = cfg.need("linear_num_key_heads", "the Gated DeltaNet state")
    nv = cfg.need("linear_num_value_heads", "the Gated DeltaNet state")
    dk = cfg.need("linear_key_head_dim", "the Gated DeltaNet state")
    dv = cfg.need("linear_value_head_dim", "the Gated DeltaNet state")
    kernel = cfg.int("linear_conv_kernel_dim", 4)
    return MambaState("gdn", 2 * nk * dk + nv * dv, kernel - 1, nv, dv * dk, _ssm_bytes(cfg))


def _nemotron_h(cfg, num_layers: int) -> tuple[LayerKind, ...]:
    """M = Mamba2, * = attention, - = MLP, E = MoE (vllm/model_executor/models/nemotron_h.py)."""
    pattern = cfg.str("hybrid_override_pattern", "")
    if len(pattern) != num_layers or set(pattern) - set("M*-E"):
        raise UsageError(
            f"{cfg.source}: 'hybrid_override_pattern' must have {num_layers} characters from M * - E, got {pattern!r}"
        )
    mamba = _mamba2_state(cfg) if "M" in pattern else None
    kinds = {
        "M": LayerKind("mamba", state=mamba),
        "*": LayerKind("full"),
        "-": LayerKind("none"),
        "E": LayerKind("none"),
    }
    return tuple(kinds[c] for c in pattern)


def _mamba2_state(cfg) -> MambaState:
    """mamba_utils.py mamba2_state_shape: conv (k-1, (heads x head_dim + 2 n_groups state)/TP), ssm (heads/TP,
    head_dim, state). vLLM's mixer keeps heads % n_groups == 0 (mamba_mixer2.py MambaMixer2): a config that
    breaks it is refused."""
    heads = cfg.need("mamba_num_heads", "the Mamba2 state")
    head_dim = cfg.need("mamba_head_dim", "the Mamba2 state")
    state = cfg.need("ssm_state_size", "the Mamba2 state")
    groups = cfg.int("n_groups", 1)
    if groups > heads or heads % groups:
        raise UsageError(
            f"{cfg.source}: config.json field '{cfg.section}n_groups' {groups} must divide "
            f"'mamba_num_heads' {heads} (Mamba2 shares each B/C group among a whole number of heads)"
        )
    return MambaState(
        "mamba2",
        heads * head_dim,
        cfg.int("conv_kernel", 4) - 1,
        heads,
        head_dim * state,
        _ssm_bytes(cfg, "float32"),
        n_groups=groups,
        group_channels=2 * state,
    )


def _llama4(cfg, num_layers: int) -> tuple[LayerKind, ...]:
    """vllm/model_executor/models/llama4.py: RoPE layers use chunked local attention, NoPE layers
    (no_rope_layers[i] == 0; transformers' default: every 4th) attend globally."""
    chunk = cfg.int("attention_chunk_size")
    raw = cfg.raw.get("no_rope_layers")
    if isinstance(raw, list) and len(raw) == num_layers:
        rope = [bool(v) for v in raw]
    else:
        every = cfg.int("no_rope_layer_interval", 4)
        rope = [(i + 1) % every != 0 for i in range(num_layers)]
    return tuple(LayerKind("chunked", chunk) if r else LayerKind("full") for r in rope)


def _deepseek_v4(cfg, num_layers: int) -> tuple[LayerKind, ...]:
    """vllm/models/deepseek_v4/attention.py DeepseekV4Attention: every layer keeps a sliding-window latent; a layer
    of compress ratio r > 1 also a compressed latent and a compressor state, r = 4 an indexer besides (ratio 0
    counts as 1). kvbench.specs.dsv4_kv sizes the caches each layer registers."""
    ratios = cfg.raw.get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) < num_layers or not all(isinstance(r, int) for r in ratios):
        raise UsageError(f"{cfg.source}: 'compress_ratios' must list at least {num_layers} integers")
    odd = sorted({r for r in ratios[:num_layers] if r not in (0, 1, 4, 128)})
    if odd:
        raise UsageError(
            f"{cfg.source}: 'compress_ratios' has {odd}; vLLM's DeepSeek V4 takes 0, 1, 4 and 128 "
            "(v1/attention/backends/mla/sparse_swa.py _layer_type_for)"
        )
    head = cfg.need("head_dim", "the DeepSeek V4 latent width")
    window = cfg.need("sliding_window", "DeepSeek V4's sliding-window latent")
    index = cfg.need("index_head_dim", "DeepSeek V4's indexer") if 4 in ratios[:num_layers] else 0
    return tuple(
        LayerKind(
            "dsv4",
            window,
            kv_heads=1,
            head_dim=head,
            latent=True,
            token_stride=max(1, r),
            index_head_dim=index if r == 4 else 0,
        )
        for r in ratios[:num_layers]
    )


def describe_layer(kind: LayerKind, act_bytes: float) -> str:
    """One spec as --explain prints it."""
    if kind.kind == "mamba":
        s = kind.state
        return (
            f"{s.mixer} state: conv {s.conv_len} x {s.conv_channels} ch, ssm {s.heads} heads x {s.head_elems} "
            f"({'model dtype' if s.ssm_bytes is None else f'{s.ssm_bytes:g} B'}), split over TP {s.tp}: "
            f"{s.bytes(act_bytes):,.0f} B per layer per rank"
        )
    if kind.kind == "dsv4":
        parts = [f"DeepSeek V4: sliding-window latent {kind.window} tok"]
        if kind.token_stride > 1:
            parts.append(f"compressed latent 1:{kind.token_stride} + compressor state")
        if kind.index_head_dim:
            parts.append(f"indexer key ({kind.index_head_dim}-wide) + its compressor state")
        return " + ".join(parts) + f", {kind.head_dim} latent (kvbench/specs/dsv4_kv.py)"
    what = {
        "full": "full attention",
        "sliding": f"sliding window {kind.window} tok",
        "chunked": f"chunked local {kind.window} tok",
        "mla": "MLA latent",
        "none": "no cache (MLP/MoE)",
    }
    text = what[kind.kind]
    if kind.kv_heads or kind.head_dim:
        text += f", {kind.kv_heads or 'model'} KV heads x {kind.head_dim or 'model'} head_dim"
    if kind.latent and kind.kind != "mla":
        text += ", one latent (no V)"
    if kind.token_stride > 1:
        text += f", compressed 1:{kind.token_stride}"
    if kind.index_bytes:
        text += f", + DSA indexer {kind.index_bytes} B/token"
    return text


def with_mamba_ssm_dtype(model, dtype: str):
    """`model` with its recurrent state's SSM part stored in `dtype` (vLLM's --mamba-ssm-cache-dtype, or a
    platform's override: vllm/platforms/cpu.py resets it to float32 for its accelerated GDN backend)."""
    from dataclasses import replace

    if dtype not in DTYPE_BYTES:
        raise UsageError(f"unknown mamba SSM dtype {dtype!r}; choose from: {', '.join(DTYPE_BYTES)}")
    layers = tuple(
        replace(k, state=replace(k.state, ssm_bytes=DTYPE_BYTES[dtype])) if k.state else k for k in model.layers
    )
    return replace(model, layers=layers)
