"""Each decoder layer's KV-cache spec from a Hugging Face config, as vLLM builds one per layer.

Full attention, sliding window (`sliding_window` + `layer_types`, Gemma 2/3 and gpt-oss patterns),
chunked local attention (Llama 4 `attention_chunk_size`, every 4th layer global), MLA (one latent of
kv_lora_rank + qk_rope_head_dim, whole on every TP rank; DeepSeek V3.2's DSA indexer key beside it),
Mamba2 (Nemotron-H `hybrid_override_pattern`) and Gated DeltaNet (Qwen3-Next / Qwen3.5 `layer_types` or
`full_attention_interval`) recurrent state. MLP/MoE-only layers cache nothing (kind "none").
"""

from __future__ import annotations

from kvbench.errors import UsageError
from kvbench.modelspec import DTYPE_BYTES, LayerKind, MambaState

# vllm/model_executor/models/deepseek_v2.py DeepseekV32IndexerCache: head_dim + head_dim // 128 * 4 bytes
# (fp8 key + one fp32 scale per 128 values), stored as uint8 whatever --kv-cache-dtype says.
INDEXER_QUANT_BLOCK = 128


def layer_kinds(cfg, num_layers: int, model_type: str, mla: bool) -> tuple[LayerKind, ...]:
    """`cfg`: hfconfig._Config of the language model (text_config where nested)."""
    if mla:
        index_dim = cfg.int("index_head_dim") if cfg.has("index_topk") else None
        index = index_dim + index_dim // INDEXER_QUANT_BLOCK * 4 if index_dim else 0
        return (LayerKind("mla", latent=True, index_bytes=index),) * num_layers
    if cfg.has("compress_ratios"):
        return _deepseek_v4(cfg, num_layers)
    if cfg.has("hybrid_override_pattern"):
        return _nemotron_h(cfg, num_layers)
    layer_types = cfg.list("layer_types")
    if cfg.has("linear_num_value_heads"):  # Qwen3-Next / Qwen3.5: Gated DeltaNet + full attention
        if not layer_types:
            every = cfg.int("full_attention_interval", 4)
            layer_types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(num_layers)]
        gdn = LayerKind("mamba", state=_gdn_state(cfg))
        return tuple(
            gdn if t == "linear_attention" else LayerKind("full") for t in _checked(cfg, layer_types, num_layers)
        )
    if cfg.has("attention_chunk_size"):
        return _llama4(cfg, num_layers)
    window = cfg.int("sliding_window")
    if layer_types:
        _checked(cfg, layer_types, num_layers)
        if any(t == "sliding_attention" for t in layer_types) and not window:
            raise UsageError(
                f"{cfg.source}: config.json lacks 'sliding_window' (needed for its sliding_attention layers)"
            )
        # Gemma 4: global layers have their own KV-head count and head size
        glob = LayerKind("full", kv_heads=cfg.int("num_global_key_value_heads"), head_dim=cfg.int("global_head_dim"))
        return tuple(LayerKind("sliding", window) if t == "sliding_attention" else glob for t in layer_types)
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
    heads = cfg.need("mamba_num_heads", "the Mamba2 state")
    head_dim = cfg.need("mamba_head_dim", "the Mamba2 state")
    state = cfg.need("ssm_state_size", "the Mamba2 state")
    # mamba2_state_shape: conv_dim = intermediate + 2 n_groups state, intermediate = heads x head_dim
    mamba = MambaState(
        "mamba2",
        heads * head_dim,
        cfg.int("conv_kernel", 4) - 1,
        heads,
        head_dim * state,
        _ssm_bytes(cfg, "float32"),
        n_groups=cfg.int("n_groups", 1),
        group_channels=2 * state,
    )
    kinds = {
        "M": LayerKind("mamba", state=mamba),
        "*": LayerKind("full"),
        "-": LayerKind("none"),
        "E": LayerKind("none"),
    }
    return tuple(kinds[c] for c in pattern)


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
    """An approximation of vLLM's DeepSeek V4 groups (stated by --explain): ratio-0 layers keep a sliding
    window of one head_dim latent; ratio-r layers one compressed latent per r tokens (their sliding part
    and the indexer of ratio-4 layers are left out)."""
    ratios = cfg.raw.get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) < num_layers:
        raise UsageError(f"{cfg.source}: 'compress_ratios' must list at least {num_layers} integers")
    head = cfg.need("head_dim", "the DeepSeek V4 latent width")
    window = cfg.need("sliding_window", "DeepSeek V4's sliding layers")
    out = []
    for r in ratios[:num_layers]:
        if r:
            out.append(LayerKind("full", head_dim=head, kv_heads=1, latent=True, token_stride=int(r)))
        else:
            out.append(LayerKind("sliding", window, head_dim=head, kv_heads=1, latent=True))
    return tuple(out)


def describe_layer(kind: LayerKind, act_bytes: float) -> str:
    """One spec as --explain prints it."""
    if kind.kind == "mamba":
        s = kind.state
        return (
            f"{s.mixer} state: conv {s.conv_len} x {s.conv_channels} ch, ssm {s.heads} heads x {s.head_elems} "
            f"({'model dtype' if s.ssm_bytes is None else f'{s.ssm_bytes:g} B'}), split over TP {s.tp}: "
            f"{s.bytes(act_bytes):,.0f} B per layer per rank"
        )
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
