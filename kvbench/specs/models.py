"""Model specs read from a Hugging Face config.json: what the KV cache and the weights need.

Any config.json path works; the shipped ones (kvbench/data/models.toml) are addressable by short name.
"""

from __future__ import annotations

from pathlib import Path

from kvbench.core.datafiles import data_path, entry_error, load_toml, read_json
from kvbench.core.errors import UsageError, unknown_choice
from kvbench.specs.hfconfig import from_config
from kvbench.specs.modelspec import DTYPE_BYTES, LayerKind, LayerParams, ModelSpec, Moe
from kvbench.specs.weightformat import WeightFormat, checkpoint_weight_format

# The spec classes, from_config and the weight format stay importable from here, where callers found them.
__all__ = [
    "DTYPE_BYTES",
    "LayerKind",
    "LayerParams",
    "ModelSpec",
    "Moe",
    "WeightFormat",
    "by_hf_id",
    "catalog",
    "checkpoint_weight_format",
    "describe_layers",
    "from_config",
    "load_model",
    "spec_for",
]


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
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), str):
            raise entry_error("models.toml", "", name_or_path, "needs a `config` file name")
        missing = f"{data_path('models.toml')}: [{name_or_path}] names config {entry['config']!r}, which is not there"
        config = read_json(data_path(entry["config"]), missing=missing)  # N-P12: one line, not a traceback
        return from_config(config, name=name_or_path, source=entry.get("source", str(entry["config"])))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return from_config(read_json(path), name=path.parent.name or str(path), source=str(path))
    raise unknown_choice("model", name_or_path, entries, extra=", or a path to a config.json")


def describe_layers(model: ModelSpec) -> str:
    """The layers by kind, as `capacity` summarises them: '48 layers (36 Gated DeltaNet, 12 full)'. Layers that keep
    no cache (Nemotron-H's MLP and MoE blocks) are counted too, as such."""
    parts = []
    for kind, count in model.layer_counts().items():
        if kind.kind == "sliding":
            parts.append(f"{count} sliding-window ({kind.window} tok)")
        elif kind.kind == "chunked":
            parts.append(f"{count} chunked-local ({kind.window} tok)")
        elif kind.kind == "mla":
            parts.append(f"{count} MLA (latent {model.kv_lora_rank}+{model.qk_rope_head_dim})")
        elif kind.kind == "mamba":
            parts.append(f"{count} {'Gated DeltaNet' if kind.state.mixer == 'gdn' else 'Mamba2'}")
        elif kind.kind == "dsv4":
            what = "sliding-window latent" + (f" + 1:{kind.token_stride} compressed" if kind.token_stride > 1 else "")
            parts.append(f"{count} DeepSeek V4 ({what}{' + indexer' if kind.index_head_dim else ''})")
        elif kind.latent:
            parts.append(f"{count} full (latent)" + (f" 1:{kind.token_stride}" if kind.token_stride > 1 else ""))
        else:
            parts.append(f"{count} full")
    uncached = sum(1 for layer in model.layers if not layer.cached)
    if uncached:
        parts.append(f"{uncached} MLP/MoE only (no cache)")
    return ", ".join(parts)


def spec_for(*candidates: str | None) -> ModelSpec | None:
    """The capacity model's view of a model named any way kvbench meets one: the embedded tiny model by its
    name, a shipped short name, a local folder or config.json; the first candidate that resolves wins, None
    when none does (a hub id whose config is not on this disk has no model-side prediction). The one lookup
    the runner, the dashboards and the nightly estimate share."""
    from kvbench.core import tinyconfig as tinymodel

    for candidate in candidates:
        if not candidate:
            continue
        if candidate == tinymodel.NAME:
            return from_config(dict(tinymodel.CONFIG), name=tinymodel.NAME, source="kvbench.core.tinyconfig.CONFIG")
        path = Path(candidate).expanduser()
        if candidate in catalog() or (path / "config.json").is_file() or path.is_file():
            try:
                return load_model(candidate)
            except UsageError:
                continue
    return None
