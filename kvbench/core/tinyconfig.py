"""The tiny model's name and Hugging Face config, read from kvbench/data/tinymodel.toml.

Core, not kvbench/tinymodel/: the capacity model sizes the built-in model from this config without importing
the model builder (which needs torch and transformers).
"""

from __future__ import annotations

from kvbench.core.datafiles import load_toml

SPEC = load_toml("tinymodel.toml")
NAME = SPEC["model"]["name"]
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    **{k: v for k, v in SPEC["model"].items() if k not in ("name", "init_seed")},
    "torch_dtype": "bfloat16",
}
