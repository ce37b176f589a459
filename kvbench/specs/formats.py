"""KV-cache storage formats (kvbench/data/formats.toml): bytes per cached token, as vLLM pages them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kvbench.core.datafiles import data_path, entry_error, load_toml
from kvbench.core.errors import UsageError, unknown_choice
from kvbench.specs import dsv4_kv
from kvbench.specs.gpus import GpuSpec
from kvbench.specs.modelspec import LayerKind, ModelSpec


@dataclass(frozen=True)
class CacheFormat:
    key: str
    description: str
    vllm_dtypes: tuple[str, ...]
    aliases: tuple[str, ...]
    data_bits: float  # 16 for `auto` means "the model's activation dtype"; K/V mean where they differ
    scale_bits: int
    scale_block: int
    head_dim_multiple: int
    supports_mla: bool
    article_bytes_per_element: float
    unsupported: tuple[dict, ...]
    source: str
    scale_bytes_per_head: int = 0  # per-token-head modes: one fp32 scale per K and per V of each head
    mla_bytes_per_token: int = 0  # a fixed MLA page layout (fp8_ds_mla: 656 B)
    mla_only: bool = False
    # asymmetric K/V (turboquant): data bits and per-head bytes of each side, the slot's rounding
    k_data_bits: float | None = None
    v_data_bits: float | None = None
    k_head_bytes: int | None = None
    v_head_bytes: int | None = None
    slot_multiple: int = 1
    native_boundary_layers: int = 0  # first and last N layers kept at `auto` (non-hybrid models)

    @property
    def vllm_dtype(self) -> str | None:
        """The --kv-cache-dtype value that selects this format in vLLM, if any."""
        return self.vllm_dtypes[0] if self.vllm_dtypes else None

    @property
    def is_vllm_dtype(self) -> bool:
        """False for kvbench's comparison formats (mxfp4): vLLM has no cache dtype for them."""
        return bool(self.vllm_dtypes)

    def element_bits(self, model: ModelSpec) -> float:
        data = model.activation_bytes * 8 if self.key == "auto" else self.data_bits
        return data

    def _head_slot_bytes(self, model: ModelSpec, dim: int) -> float:
        """Bytes one KV head's token takes: K side + V side (data, block scales, per-head bytes), rounded up to
        the slot multiple (turboquant_attn.py customize_spec / TurboQuantConfig.slot_size_aligned)."""
        scales = dim / self.scale_block * self.scale_bits / 8 if self.scale_block else 0.0
        sides = 0.0
        for bits, extra in (
            (self.k_data_bits, self.k_head_bytes),
            (self.v_data_bits, self.v_head_bytes),
        ):
            bits = self.element_bits(model) if bits is None else bits
            data = dim * bits / 8
            sides += (math.ceil(data) if bits < 8 else data) + scales
            sides += self.scale_bytes_per_head if extra is None else extra
        return math.ceil(sides / self.slot_multiple) * self.slot_multiple if self.slot_multiple > 1 else sides

    def _native_share(self, model: ModelSpec) -> float:
        """The share of layers vLLM keeps at `auto` (TurboQuantConfig.get_boundary_skip_layers: the first and
        last N of a model without Mamba/linear-attention layers; none on a hybrid)."""
        if not self.native_boundary_layers or any(layer.kind == "mamba" for layer in model.layers):
            return 0.0
        total = model.num_layers
        n = min(self.native_boundary_layers, total // 2)
        return len(set(range(n)) | set(range(total - n, total))) / total if total else 0.0

    def bytes_per_element(self, model: ModelSpec) -> float:
        """Bytes per cached K or V value, block scales included."""
        scales = self.scale_bits / self.scale_block / 8 if self.scale_block else 0.0
        return self.element_bits(model) / 8 + scales

    def bytes_per_token_per_layer(self, model: ModelSpec, layer: LayerKind) -> float:
        """Bytes one token takes in one layer's page (kv_cache_interface.py AttentionSpec.page_size_bytes /
        block_size). Mamba state is per request, not per token (kvbench.specs.vllm_accounting)."""
        if layer.kind == "dsv4":  # the compressed latent and indexer key, fp8_ds_mla whatever the dtype
            return dsv4_kv.bytes_per_token(layer)
        if not layer.cached or layer.kind == "mamba":
            return 0.0
        if layer.kind == "mla":
            if self.mla_bytes_per_token or (layer.index_bytes and self.key.startswith("fp8")):
                # sparse MLA (an indexer) serves any fp8 dtype as fp8_ds_mla (mla_attention.py
                # _canonicalize_sparse_mla_kv_cache_dtype)
                latent = self.mla_bytes_per_token or 656
            else:  # one latent vector per token (no separate V): kv_lora_rank + the RoPE part
                latent = (model.kv_lora_rank + model.qk_rope_head_dim) * self.bytes_per_element(model)
            return latent + layer.index_bytes
        heads = layer.kv_heads or model.num_kv_heads
        dim = layer.head_dim or model.head_dim
        if layer.latent:
            return dim * self.bytes_per_element(model) / layer.token_stride
        packed = heads * self._head_slot_bytes(model, dim) / layer.token_stride
        share = self._native_share(model)
        if share:  # spread over the layers: one KV-cache group holds them all (UniformTypeKVCacheSpecs)
            native = 2 * heads * dim * model.activation_bytes / layer.token_stride
            return share * native + (1 - share) * packed
        return packed

    def unsupported_reason(self, model: ModelSpec, gpu: GpuSpec | None = None) -> str | None:
        """Why vLLM would refuse this format for this model (and GPU), or None."""
        if any(layer.kind == "dsv4" for layer in model.layers):
            return dsv4_kv.refusal(self.vllm_dtype)
        if model.is_mla and not self.supports_mla:
            return f"{self.key} with MLA is not supported by vLLM"
        if self.mla_only and not model.is_mla:
            return f"{self.key} is an MLA page layout; the model has no MLA layers"
        if self.head_dim_multiple and model.head_dim % self.head_dim_multiple:
            return f"{self.key} needs head_dim divisible by {self.head_dim_multiple}; model has {model.head_dim}"
        for rule in self.unsupported:
            if gpu is None and "sm_in" in rule:
                continue
            if "sm_in" in rule and gpu.sm not in rule["sm_in"]:
                continue
            if "head_dims" in rule and model.head_dim not in rule["head_dims"]:
                continue
            if rule.get("attention_sinks") and not model.attention_sinks:
                continue
            return rule["reason"]
        if gpu is not None and self.vllm_dtype:
            from kvbench.specs import vllm_support

            return vllm_support.refusal(self.vllm_dtype, model, gpu.sm)
        return None


def catalog() -> dict[str, CacheFormat]:
    raw = _table(load_toml("formats.toml"), "formats")
    out = {}
    for key, v in raw.items():  # an overlay's entry that lacks a field or holds a bad one: one line (N-P12)
        try:
            out[key] = _format(key, v)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise entry_error("formats.toml", "formats", key, exc) from None
        if not out[key].data_bits > 0:
            raise entry_error("formats.toml", "formats", key, f"needs data_bits above 0, got {out[key].data_bits}")
    return out


def _table(raw: dict, name: str) -> dict:
    if not isinstance(raw.get(name), dict):
        raise UsageError(f"{data_path('formats.toml')}: no [{name}] tables; it holds the KV-dtype registry")
    return raw[name]


def _format(key: str, v: dict) -> CacheFormat:
    return CacheFormat(
        key=key,
        description=v["description"],
        vllm_dtypes=tuple(v.get("vllm_dtypes", ())),
        aliases=tuple(v.get("aliases", ())),
        data_bits=_number(v["data_bits"]),
        scale_bits=int(v["scale_bits"]),
        scale_block=int(v["scale_block"]),
        head_dim_multiple=int(v.get("head_dim_multiple", 0)),
        supports_mla=bool(v.get("supports_mla", True)),
        article_bytes_per_element=float(v["article_bytes_per_element"]),
        unsupported=tuple(v.get("unsupported", ())),
        source=v["source"],
        scale_bytes_per_head=int(v.get("scale_bytes_per_head", 0)),
        mla_bytes_per_token=int(v.get("mla_bytes_per_token", 0)),
        mla_only=bool(v.get("mla_only", False)),
        k_data_bits=v.get("k_data_bits"),
        v_data_bits=v.get("v_data_bits"),
        k_head_bytes=v.get("k_head_bytes"),
        v_head_bytes=v.get("v_head_bytes"),
        slot_multiple=int(v.get("slot_multiple", 1)),
        native_boundary_layers=int(v.get("native_boundary_layers", 0)),
    )


def _number(value) -> float:
    """An int where the file gives a whole number (8, not 8.0, in every printed label)."""
    return int(value) if float(value).is_integer() else float(value)


def get_format(name: str) -> CacheFormat:
    formats = catalog()
    for fmt in formats.values():
        if name == fmt.key or name in fmt.aliases or name in fmt.vllm_dtypes:
            return fmt
    names = set(formats) | {a for f in formats.values() for a in f.aliases}
    raise unknown_choice("KV-cache dtype", name, names)


ALL = "all"  # --kv-dtypes all: vLLM's whole --kv-cache-dtype menu


def menu() -> list[CacheFormat]:
    """The formats of vLLM's --kv-cache-dtype menu (vllm/config/cache.py CacheDType, as the support matrix
    kvbench.specs.vllm_support stores it), in the registry's order; comparison formats (mxfp4) are not on it."""
    from kvbench.specs import vllm_support

    out: list[CacheFormat] = []
    for fmt in (get_format(value) for value in vllm_support.cache_dtypes()):
        if fmt not in out:
            out.append(fmt)
    return sorted(out, key=lambda f: order_key(f.key))


def parse_format_list(text: str, flag: str = "--kv-dtypes") -> list[CacheFormat]:
    """Formats named in a comma list (aliases count once); `all` is vLLM's whole menu (`menu()`)."""
    from kvbench.core import cliargs

    out: list[CacheFormat] = []
    names = cliargs.names(text, flag, ",".join(tracked_dtypes()))
    names = [n for name in names for n in ([f.key for f in menu()] if name == ALL else [name])]
    for fmt in (get_format(name) for name in names):
        if fmt not in out:  # aliases of one format count once (CacheFormat is not hashable)
            out.append(fmt)
    return out


def format_ratio(a: CacheFormat, b: CacheFormat, model: ModelSpec) -> float:
    """Tokens that fit with format `a` over tokens with `b` on the same budget (page rounding aside)."""
    bytes_a = sum(a.bytes_per_token_per_layer(model, layer) for layer in model.layers)
    bytes_b = sum(b.bytes_per_token_per_layer(model, layer) for layer in model.layers)
    return bytes_b / bytes_a


# The registry's other views (formats.toml's header says what each field means). Each reads the file at call
# time (load_toml keeps the parse), so a $KVBENCH_DATA_DIR copy with a new dtype is seen everywhere.


def _entries() -> dict[str, dict]:
    """Every named entry, vLLM formats and kernel-only numerics (fp16, bf16, ...), in the file's order."""
    return _checked(data_path("formats.toml"))


@cache
def _checked(path: Path) -> dict[str, dict]:
    """The entries of the registry at `path`, or a one-line error naming the entry and field that is wrong."""
    raw = load_toml("formats.toml")
    entries = {**_table(raw, "formats"), **raw.get("kernel_formats", {})}
    clash = set(raw["formats"]) & set(raw.get("kernel_formats", {}))
    places: dict[float, str] = {}
    for name, e in entries.items():
        where = f"{path}: [{'kernel_formats' if name in raw.get('kernel_formats', {}) else 'formats'}.{name}]"
        if name in clash:
            raise UsageError(f"{where} is both a format and a kernel-only format; keep one")
        if not isinstance(e.get("order"), int | float) or not math.isfinite(e["order"]):  # nan: N-P12
            raise UsageError(f"{where} needs a number `order`, its place in the precision order")
        if e["order"] in places:
            raise UsageError(f"{where} has order {e['order']}, already {places[e['order']]}'s; each needs its own")
        places[e["order"]] = name
        if e.get("tracked") and not ("speed_kernel" in e and "accuracy_variant" in e):
            raise UsageError(f"{where} is tracked, so it needs `speed_kernel` and `accuracy_variant`")
    for name, e in entries.items():
        for key, role in (
            (e.get("speed_kernel"), "cache_kernel"),
            ((e.get("accuracy_variant") or [None])[0], "accuracy_study"),
        ):
            if key is not None and not entries.get(key, {}).get(role):
                raise UsageError(
                    f"{path}: [formats.{name}] names kernel key {key!r}, which has no `{role} = true` entry"
                )
    return entries


def dtype_order() -> tuple[str, ...]:
    """Every dtype and kernel key, most precise first: the order legends, tables and ties read in."""
    entries = _entries()
    return tuple(sorted(entries, key=lambda name: entries[name]["order"]))


def order_key(dtype: str) -> tuple[float, str]:
    """Sort key in the registry's order; a name it does not hold goes last (by name)."""
    entry = _entries().get(dtype) or _entries().get(str(dtype).split("@", 1)[0])  # a --kv-scales variant: its dtype's
    return (entry["order"] if entry else 1_000_000, str(dtype))


def look(dtype: str) -> dict:
    """{"color", "marker", "dash", "pattern"} the registry gives the dtype (those it gives; {} for an unknown name)."""
    entry = _entries().get(dtype) or _entries().get(str(dtype).split("@", 1)[0], {})  # dtype@variant: its dtype's
    return {k: entry[k] for k in ("color", "marker", "dash", "pattern") if k in entry}


def tracked_dtypes() -> tuple[str, ...]:
    """The dtypes tracked over time (asv's kv_dtype parameter), in order: the same on every machine."""
    return tuple(d for d in dtype_order() if _entries()[d].get("tracked"))


def speed_kernels() -> tuple[str, ...]:
    """The kernel keys the tracked dtypes' kernel speed is measured with (fp16 : fp8 : nvfp4), in order."""
    return tuple(_entries()[d]["speed_kernel"] for d in tracked_dtypes())


def accuracy_variants() -> dict[str, tuple[str, str]]:
    """Tracked dtype -> (accuracy-study kernel key, tensor-scale convention) of the accuracy track."""
    return {d: tuple(_entries()[d]["accuracy_variant"]) for d in tracked_dtypes()}


def numerics_modules() -> dict[str, str]:
    """Kernel key -> the kvbench.kernels module that implements its numerics (the entry's `numerics` field), in
    order: kvbench.kernels.codecs imports it to find the key's Codec."""
    return {d: _entries()[d]["numerics"] for d in dtype_order() if _entries()[d].get("numerics")}


def kernel_formats(role: str) -> tuple[str, ...]:
    """Kernel keys in order with `role` set: "cache_kernel" (the Triton paged-cache kernels) or
    "accuracy_study" (the attention-accuracy study)."""
    return tuple(d for d in dtype_order() if _entries()[d].get(role))
