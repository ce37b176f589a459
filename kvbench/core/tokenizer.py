"""A model's tokenizer from a local folder, as vLLM and lm-eval load it (transformers' AutoTokenizer), without
paying for AutoTokenizer's imports when the folder names the class outright.

`from transformers import AutoTokenizer` imports transformers' auto-model tables, its generation utilities and,
through them, scikit-learn: about 4.5 s on 2 cores, in every `kvbench run` and again in its lm-eval worker. A
folder whose tokenizer_config.json says `"tokenizer_class": "TokenizersBackend"` (every model kvbench builds,
and transformers 5's own choice for a plain tokenizer.json) gets exactly that class from AutoTokenizer, so it is
loaded directly; any other folder goes through AutoTokenizer. tests/unit/test_tokenizer.py checks that both
paths give the same tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

# The classes AutoTokenizer returns as named (no "Fast" twin, no per-model subclass to pick).
DIRECT = ("TokenizersBackend",)


def tokenizer_class(path: str | Path) -> str | None:
    """The class a local tokenizer folder names in tokenizer_config.json, or None (no file, not JSON, no name)."""
    try:
        cfg = json.loads((Path(path) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    name = cfg.get("tokenizer_class") if isinstance(cfg, dict) else None
    return name if isinstance(name, str) else None


def load_tokenizer(path: str | Path):
    """The model's own tokenizer from a local directory (no hub access)."""
    if tokenizer_class(path) in DIRECT:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
