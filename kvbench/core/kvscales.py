"""Where a quantized KV cache's scales come from, as vLLM 0.32 takes them, and what a checkpoint carries.

What vLLM 0.32 does (file and function in the installed package):
- Every attention layer starts with k_scale = v_scale = 1.0 (model_executor/layers/attention/attention.py,
  set_default_quant_scales). The attention backend reads layer._k_scale_float / _v_scale_float on every write
  and read (v1/attention/backends/cpu_attn.py; kvbench's emulated backends, kernels/cpu_emulated.py, too).
- Only a checkpoint whose `quantization_config` gives attention a KV-cache method loads `k_scale` / `v_scale`
  tensors into them (_init_kv_cache_quant): compressed-tensors with a `kv_cache_scheme`
  (CompressedTensorsKVCacheMethod: placeholders of 1.0, overwritten by what the checkpoint holds, *zero
  included*, no message), ModelOpt's `kv_cache_quant_algo`, fp8 and quark (BaseKVCacheMethod: a scale <= 0 is
  "not loaded", 1.0 with the warning "Using KV cache scaling factor 1.0 for fp8_e4m3"). The names it maps are
  quantization/base_config.py get_cache_scale_mapper's: `...self_attn.k_scale`, `...self_attn.k_proj.k_scale`,
  the deprecated `...kv_scale` and others ending in k_scale / v_scale / kv_scale / k_cache.scale.
- A checkpoint with scale tensors but no such config does not load them: the model has no parameter of that
  name (AutoWeightsLoader refuses the checkpoint).
- The per-token-head dtypes compute a scale per (token, head) as each token is written (config/cache.py logs
  "Dynamic per-token-head scales will be computed at runtime"); turboquant and ultraquant keep their own
  per-vector norms / power-of-two block scales in the page. Nothing in 0.32 computes a per-tensor scale at
  start-up: `calculate_kv_scales` is gone, so "computed at start-up" is never a source here.

This module reads the checkpoint (safetensors headers and the scale tensors' few bytes, never the weights) and
vLLM's start-up log; harness/kvscales.py decides each dtype's source and kvbench calibrates its own scales
(harness/server/kvcalibrate.py). A scale that is zero, not finite, negative or missing for some layers is a problem,
said in the record (llm-compressor issue 2853: calibration silently writing zero scales).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

# The scale a dtype's cache was written with: none (not quantized), unit (vLLM's 1.0), checkpoint (the served
# checkpoint's tensors), dynamic (computed per token/head/block as it is written, kept in the page)
NONE, UNIT, CHECKPOINT, DYNAMIC = "none", "unit", "checkpoint", "dynamic"
SOURCES = (NONE, UNIT, CHECKPOINT, DYNAMIC)

# --kv-scales: the variants a run serves a scaled dtype with. "checkpoint" is the model as given (its own scales,
# else vLLM's unit 1.0); "unit" strips a checkpoint's scales; "calibrated" is kvbench's own, from the model's K/V.
VARIANTS = ("checkpoint", "unit", "calibrated")
SEP = "@"  # a variant's label: "fp8@calibrated" (no vLLM cache dtype holds it)

SCALE_NAME = re.compile(r"\.(?:(k|v|kv)_scale|(k|v)_cache\.scale)$")
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_DTYPES = {"F32": ("f", 4), "F64": ("d", 8), "F16": ("e", 2), "BF16": (None, 2)}

# vLLM 0.32's own words about KV scales at start-up, each with what it says (model_executor/layers/quantization/
# kv_cache.py, config/cache.py, model_loader/weight_utils.py maybe_remap_kv_scale_name, models/utils.py)
LOG_LINES = {
    "Using KV cache scaling factor 1.0": "no checkpoint scales: unit 1.0",
    "Using uncalibrated q_scale": "fp8 attention with an uncalibrated q/prob scale",
    "Checkpoint does not provide a q scaling factor": "q scale taken from k_scale",
    "but not found the expected name in the model": "a checkpoint scale vLLM did not load",
    "Found kv_scale in the checkpoint": "deprecated fused kv_scale: k_scale duplicated to v_scale",
    "Dynamic per-token-head scales will be computed at runtime": "scales per token and head, at write",
    "may cause accuracy drop without a proper scaling factor": "quantized cache: a scale is needed",
}


def base_dtype(label: str) -> str:
    """The vLLM cache dtype of a record's dtype label ("fp8@calibrated" -> "fp8")."""
    return label.split(SEP, 1)[0]


def variant_of(label: str) -> str | None:
    """The scales variant a label names, None for a plain dtype (the model as given)."""
    return label.split(SEP, 1)[1] if SEP in label else None


def label(dtype: str, variant: str) -> str:
    """The record's label of a dtype served with a scales variant; the model as given keeps the plain name."""
    return dtype if variant == "checkpoint" else f"{dtype}{SEP}{variant}"


@dataclass
class CheckpointScales:
    """What a checkpoint folder says about KV scales: its quantization_config's KV method, and per layer the
    k_scale / v_scale tensors' values (max over heads where a layer has one per head)."""

    folder: str
    quant_method: str | None = None
    kv_method: str | None = None  # what in quantization_config makes vLLM load KV scales, None: nothing
    k: dict[int, float] = field(default_factory=dict)
    v: dict[int, float] = field(default_factory=dict)
    per_head: bool = False
    layers: int | None = None  # num_hidden_layers from config.json
    tensors: int = 0  # scale tensors found
    problems: list[str] = field(default_factory=list)

    @property
    def has_scales(self) -> bool:
        return bool(self.k or self.v)

    def summary(self) -> dict:
        """The record's view: the method, each side's range over layers, the problems."""

        def side(values: dict[int, float]) -> dict | None:
            if not values:
                return None
            finite = [x for x in values.values() if math.isfinite(x)]
            return {
                "layers": len(values),
                "min": min(finite) if finite else None,
                "max": max(finite) if finite else None,
                "values": [values[i] for i in sorted(values)] if len(values) <= 64 else None,
            }

        return {
            "quant_method": self.quant_method,
            "kv_method": self.kv_method,
            "k_scale": side(self.k),
            "v_scale": side(self.v),
            "per_head": self.per_head,
            "problems": list(self.problems),
        }


def kv_method(qcfg: dict | None) -> str | None:
    """What in a quantization_config makes vLLM 0.32 give attention a KV-cache method (loading its scales)."""
    if not isinstance(qcfg, dict):
        return None
    method = str(qcfg.get("quant_method") or "").lower()
    if method == "compressed-tensors" and qcfg.get("kv_cache_scheme"):
        return "compressed-tensors kv_cache_scheme"
    if method.startswith("modelopt") and (qcfg.get("kv_cache_quant_algo") or qcfg.get("kv_cache_scheme")):
        return f"modelopt kv_cache_quant_algo {qcfg.get('kv_cache_quant_algo') or 'FP8'}"
    if method in ("fp8", "quark", "ptpc_fp8", "fbgemm_fp8"):
        return f"{method} (BaseKVCacheMethod)"
    return None


def _header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100 << 20:
            raise ValueError(f"{path}: a safetensors header of {n:,} bytes")
        return json.loads(f.read(n)), 8 + n


def _values(path: Path, start: int, meta: dict) -> list[float]:
    fmt, size = _DTYPES.get(meta.get("dtype"), (None, 0))
    lo, hi = meta["data_offsets"]
    if not size or hi - lo > 1 << 16:  # a scale is a scalar or one per head: never more than a few KB
        raise ValueError(f"a scale tensor of dtype {meta.get('dtype')} and {hi - lo:,} bytes")
    with open(path, "rb") as f:
        f.seek(start + lo)
        raw = f.read(hi - lo)
    n = len(raw) // size
    if fmt is None:  # bf16: the high half of a float32
        return [struct.unpack("<f", b"\0\0" + raw[2 * i : 2 * i + 2])[0] for i in range(n)]
    return list(struct.unpack(f"<{n}{fmt}", raw))


def read_checkpoint(folder: str | Path) -> CheckpointScales:
    """The KV scales a checkpoint folder holds, read from its safetensors headers and the scale tensors' bytes
    (the weights are never read), with what is wrong with them."""
    folder = Path(folder)
    out = CheckpointScales(str(folder))
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    qcfg = cfg.get("quantization_config")
    out.quant_method = (qcfg or {}).get("quant_method") if isinstance(qcfg, dict) else None
    out.kv_method = kv_method(qcfg)
    out.layers = cfg.get("num_hidden_layers") or (cfg.get("text_config") or {}).get("num_hidden_layers")
    for path in sorted(folder.glob("*.safetensors")):
        header, start = _header(path)
        for name, meta in header.items():
            m = SCALE_NAME.search(name)
            if name == "__metadata__" or not m or ".q_scale" in name:
                continue
            side = m.group(1) or m.group(2)
            layer = _LAYER.search(name)
            idx = int(layer.group(1)) if layer else -1
            vals = _values(path, start, meta)
            out.tensors += 1
            out.per_head = out.per_head or len(vals) > 1
            # vLLM takes the largest where a layer has one per head (CompressedTensorsKVCacheMethod._to_scalar)
            value = max(vals) if vals and all(math.isfinite(x) for x in vals) else math.nan
            for s in ("k", "v") if side == "kv" else (side,):
                getattr(out, s)[idx] = value
    out.problems = problems(out)
    return out


def problems(ck: CheckpointScales) -> list[str]:
    """What is wrong with a checkpoint's KV scales, one line each (empty: nothing)."""
    out = []
    for side in ("k", "v"):
        values = getattr(ck, side)
        for kind, bad in (
            ("zero", [i for i, x in values.items() if x == 0]),
            ("not finite", [i for i, x in values.items() if not math.isfinite(x)]),
            ("negative", [i for i, x in values.items() if x < 0]),
        ):
            if bad:
                out.append(f"{side}_scale is {kind} in {_layers(bad, len(values))}")
    if ck.has_scales:
        want = set(range(ck.layers)) if ck.layers else set(ck.k) | set(ck.v)
        for side in ("k", "v"):
            missing = sorted(want - set(getattr(ck, side)))
            if missing:
                out.append(f"no {side}_scale for {_layers(missing, len(want))} (vLLM keeps 1.0 there)")
        if ck.kv_method is None:
            out.append(
                f"{ck.tensors} KV scale tensors but no KV-cache method in quantization_config: vLLM 0.32 does not "
                "load them (the cache runs at unit scale, or the load fails)"
            )
    elif ck.kv_method is not None:
        out.append(f"quantization_config declares {ck.kv_method} but the checkpoint has no KV scale tensors")
    return out


def _layers(idx: list[int], total: int) -> str:
    shown = ", ".join(str(i) for i in idx[:8]) + (", ..." if len(idx) > 8 else "")
    return f"{len(idx)} of {total} layers ({shown})"


def log_evidence(lines: list[str]) -> list[str]:
    """vLLM's own start-up lines about KV scales (LOG_LINES), each once, as it wrote them (trimmed)."""
    out: list[str] = []
    for line in lines:
        if any(key in line for key in LOG_LINES):
            text = line.strip()[-300:]
            if text not in out:
                out.append(text)
    return out
