"""Speculative decoding as vLLM 0.32 sizes it: the drafter's layers join the KV cache and its weights the model.

vLLM loads the drafter in the same worker as the target (vllm/v1/worker/gpu_model_runner.py GPUModelRunner.
load_model: `self.drafter.load_model(self.model)` inside the DeviceMemoryProfiler whose figure "Model loading
took" logs), registers its attention layers in the same forward context, so GPUModelRunner.get_kv_cache_spec
gives them KV specs beside the target's and vllm/v1/core/kv_cache_utils.py get_kv_cache_groups groups them
together. Besides:
  * every Mamba/GDN layer's conv state keeps num_speculative_tokens more positions (model_executor/layers/mamba/
    mamba_utils.py MambaStateShapeCalculator: num_spec), and num_speculative_tokens more state pages per request
    (vllm/model_executor/layers/mamba/abstract.py MambaBase.get_kv_cache_spec: num_speculative_blocks;
    kv_cache_interface.py MambaSpec.max_memory_usage_bytes);
  * a multi-module MTP drafter makes sliding-window layers keep num_speculative_tokens - 1 more tokens
    (kv_cache_utils.py get_kv_cache_configs: extra_retained_tokens; config/vllm.py num_prefill_lookahead_tokens);
  * async scheduling, and with it two batches in flight, stays on only for EAGLE-type, MTP, draft-model,
    ngram_gpu, DFlash and DSpark methods (config/vllm.py VllmConfig.__post_init__).

The drafter's shape: MTP layers from the target's config (`mtp_num_hidden_layers`, Qwen3.5/3.6:
model_executor/models/qwen3_5_mtp.py, full attention; `num_nextn_predict_layers`, DeepSeek and Qwen3-Next:
deepseek_mtp.py, qwen3_next_mtp.py), each the target's last attention layer plus its 2h x h `eh_proj`/`fc` and
norms, sharing the target's embedding and head. EAGLE / EAGLE-3 / DFlash drafters and draft models from the
drafter's own config where one is given (METHOD:N@CONFIG); without one, an EAGLE drafter is estimated as one
decoder layer of the target's shape (stated as an estimate).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvbench.core.errors import UsageError
from kvbench.specs.modelspec import LayerKind, LayerParams, ModelSpec

# vLLM 0.32 methods (config/speculative.py SpeculativeMethod) and what each adds
MTP_METHODS = {"mtp", "deepseek_mtp", "qwen3_next_mtp", "qwen3_5_mtp", "nemotron_h_mtp", "glm4_moe_mtp", "mimo_mtp"}
EAGLE_METHODS = {"eagle", "eagle3", "dflash", "dspark", "extract_hidden_states"}
NO_DRAFT_METHODS = {"ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator"}
ASYNC_METHODS = MTP_METHODS | EAGLE_METHODS | {"draft_model", "ngram_gpu"}
METHODS = sorted(MTP_METHODS | EAGLE_METHODS | NO_DRAFT_METHODS | {"draft_model"})


@dataclass(frozen=True)
class SpeculativeSpec:
    method: str
    num_tokens: int
    layers: tuple[LayerKind, ...]  # the drafter's KV layers, in the target's terms
    layer_params: tuple[LayerParams, ...]  # their parameters
    extra_params: int  # parameters outside those layers (a drafter's own head and embedding)
    source: str  # where the drafter's shape comes from
    estimate: bool  # True where the shape is kvbench's estimate, not a config's

    @property
    def async_scheduling(self) -> bool:
        return self.method in ASYNC_METHODS

    @property
    def retained_tokens(self) -> int:
        """Sliding-window tokens kept beyond the window (multi-module MTP: num_speculative_tokens - 1)."""
        return max(0, self.num_tokens - 1) if self.method in MTP_METHODS and len(self.layers) > 1 else 0

    def describe(self) -> str:
        what = f"{len(self.layers)} draft KV layer(s)" if self.layers else "no draft KV layers"
        return f"{self.method}, {self.num_tokens} token(s): {what} ({self.source})"


def speculative_flag(text: str, target: ModelSpec) -> SpeculativeSpec:
    """`--speculative METHOD[:N][@DRAFT]`: DRAFT a shipped model name or a path to the drafter's config.json."""
    head, _, draft_name = text.partition("@")
    draft = None
    if draft_name:
        from kvbench.specs.models import load_model

        draft = load_model(draft_name)
    return parse_speculative(head, target, draft)


def parse_speculative(text: str, target: ModelSpec, draft: ModelSpec | None = None) -> SpeculativeSpec:
    """`METHOD[:N]` (N speculative tokens, default 1) for `target`; `draft`: the drafter's own config where known."""
    method, _, count = text.partition(":")
    method = method.strip().lower()
    if method not in METHODS:
        raise UsageError(f"unknown speculative method {method!r}; choose from: {', '.join(METHODS)}")
    try:
        tokens = int(count) if count else 1
    except ValueError:
        tokens = 0
    if tokens < 1:
        raise UsageError(f"--speculative {text!r}: the token count after ':' must be a positive integer")
    if method in NO_DRAFT_METHODS:
        return SpeculativeSpec(method, tokens, (), (), 0, "no drafter model (n-gram / suffix lookup)", False)
    if draft is not None:
        return _from_draft(method, tokens, target, draft)
    if method in MTP_METHODS:
        return _mtp(method, tokens, target)
    if method == "draft_model":
        raise UsageError(
            "--speculative draft_model needs the draft model's config: give it as draft_model:N@NAME or "
            "draft_model:N@PATH/config.json"
        )
    return _eagle_estimate(method, tokens, target)


def _attention_layer(target: ModelSpec) -> int:
    """The target's last layer that keeps an attention KV cache (MTP and EAGLE drafters copy its shape)."""
    for i in range(len(target.layers) - 1, -1, -1):
        if target.layers[i].kind in ("full", "mla"):
            return i
    raise UsageError(f"{target.name}: no full-attention layer to shape a draft layer on")


def _mtp(method: str, tokens: int, target: ModelSpec) -> SpeculativeSpec:
    n = target.mtp_layers
    if not n:
        raise UsageError(
            f"{target.name}'s config names no MTP layers ('mtp_num_hidden_layers' / 'num_nextn_predict_layers'); "
            "MTP needs them, or choose another --speculative method"
        )
    dsv4 = next((k for k in target.layers if k.kind == "dsv4"), None)
    # DeepSeek V4's MTP block is a decoder layer past num_hidden_layers: compress ratio 1, so only its
    # sliding-window latent (models/deepseek_v4/attention.py: "MTP layer is not included in the compress ratio list")
    i = len(target.layers) - 1 if dsv4 else _attention_layer(target)
    kind = replace(dsv4, token_stride=1, index_head_dim=0) if dsv4 else target.layers[i]
    h = target.hidden_size
    p = target.layer_params[i]
    # eh_proj / fc: 2h -> h; enorm, hnorm and the final norm
    layer = LayerParams(p.attention, p.kv_proj, p.dense_mlp + 2 * h * h, p.experts, p.router, p.norms + 3 * h)
    source = f"{n} MTP layer(s) shaped like layer {i} + 2h x h projection, from the config"
    return SpeculativeSpec(method, tokens, (kind,) * n, (layer,) * n, 0, source, False)


def _eagle_estimate(method: str, tokens: int, target: ModelSpec) -> SpeculativeSpec:
    i = _attention_layer(target)
    h = target.hidden_size
    p = target.layer_params[i]
    fc = (3 if method == "eagle3" else 2) * h * h
    layer = LayerParams(p.attention, p.kv_proj, p.dense_mlp + fc, 0, 0, p.norms + h)
    source = (
        f"estimate: one decoder layer shaped like the target's layer {i} + {fc // (h * h)}h x h fc "
        f"(no drafter config; give METHOD:N@CONFIG)"
    )
    return SpeculativeSpec(method, tokens, (target.layers[i],), (layer,), 0, source, True)


def _from_draft(method: str, tokens: int, target: ModelSpec, draft: ModelSpec) -> SpeculativeSpec:
    """A drafter with its own config: its layers, in the target's terms (explicit KV heads and head size where they
    differ from the target's), and its embedding and head where it has its own (EAGLE shares the target's)."""
    layers = tuple(_as_target_layer(k, draft, target) for k in draft.layers)
    own = draft.vocab_size * draft.hidden_size * (1 if draft.tie_word_embeddings else 2)
    extra = own if method == "draft_model" else 0
    return SpeculativeSpec(
        method, tokens, layers, tuple(draft.layer_params), extra, f"the drafter's config ({draft.source})", False
    )


def _as_target_layer(kind: LayerKind, draft: ModelSpec, target: ModelSpec) -> LayerKind:
    if kind.kind in ("mamba", "none", "mla"):
        return kind
    heads = kind.kv_heads or draft.num_kv_heads
    dim = kind.head_dim or draft.head_dim
    return replace(
        kind,
        kv_heads=None if heads == target.num_kv_heads else heads,
        head_dim=None if dim == target.head_dim else dim,
    )


def with_speculative(model: ModelSpec, spec: SpeculativeSpec | None) -> ModelSpec:
    """`model` as vLLM serves it with `spec`: the drafter's KV layers and parameters appended (they sit on the last
    pipeline stage), its token count for the recurrent state's extra pages."""
    if spec is None:
        return model
    params = dict(model.params)
    layers, layer_params = spec.layers, spec.layer_params
    if spec.extra_params:  # a draft model's own embedding and head: weights, no cache (vocab-parallel over TP)
        layers += (LayerKind("none"),)
        layer_params += (LayerParams(0, 0, spec.extra_params, 0, 0, 0),)
    added = sum(p.total for p in layer_params)
    if added:
        params["speculative"] = added
    scale = model.weight_bytes / model.param_count if model.param_count else 2.0
    # the conv state keeps conv_kernel - 1 + num_spec positions (mamba_utils.py gated_delta_net_state_shape,
    # mamba2_state_shape: num_spec), so a recurrent layer's page grows with the token count
    grown = tuple(
        replace(k, state=replace(k.state, conv_len=k.state.conv_len + spec.num_tokens)) if k.state else k
        for k in model.layers + layers
    )
    return replace(
        model,
        name=f"{model.name} + {spec.method}",
        layers=grown,
        layer_params=model.layer_params + layer_params,
        num_layers=model.num_layers + len(layers),
        params=params,
        weight_bytes=model.weight_bytes + added * scale,
        speculative_tokens=spec.num_tokens,
        retained_tokens=spec.retained_tokens,
    )
