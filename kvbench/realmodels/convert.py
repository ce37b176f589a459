"""A GGUF file into a folder vLLM serves: bf16 safetensors, config.json and the tokenizer, via transformers.

transformers (5.19) can load a GGUF but keeps its weights packed and then refuses `save_pretrained`; its reader
`load_gguf_checkpoint` with a model to map names onto returns the tensors dequantized, under Hugging Face names,
with transformers' own per-architecture fixes applied (Llama's q/k rows un-permuted, Gemma's norm offset
removed). Those tensors are written as they come (tied embeddings stay tied: `lm_head` is not in the file).
The model is built on the meta device only for its names: nothing is initialised.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

DTYPE = "bfloat16"


def _quiet_transformers() -> None:
    """kvbench draws its own progress; transformers' tqdm bars and deprecation chatter would interleave."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def convert(
    gguf: Path,
    out: Path,
    *,
    add_bos: bool,
    step: Callable[[str], None] | None = None,
    advance: Callable[[int, int], None] | None = None,
) -> dict:
    """Write `gguf` as a bf16 folder into `out` (which exists, empty); returns what it wrote: architecture,
    tensor count, parameters, the libraries' versions. `step(text)` names each step, `advance(done, total)`
    counts the tensors dequantized."""
    import gguf as gguf_lib
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    _quiet_transformers()
    say = step or (lambda _text: None)
    gguf = Path(gguf)
    say("reading the GGUF's config")
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    say("dequantizing the weights to bf16")
    with _counted(advance):
        tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model, torch_dtype=torch.bfloat16)[
            "tensors"
        ]
    expected = set(model.state_dict())
    if getattr(config, "tie_word_embeddings", False):
        expected.discard("lm_head.weight")
    missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - set(model.state_dict()))
    if missing or extra:
        raise RuntimeError(
            f"the GGUF's tensors do not fit {type(model).__name__}: missing {missing[:3]}, extra {extra[:3]}"
        )
    say("writing model.safetensors")
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in sorted(tensors.items())}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    # what vLLM reads to pick its model class; transformers leaves it unset for a GGUF-made config
    config.architectures = [type(model).__name__]
    config.dtype = torch.bfloat16
    config.save_pretrained(out)
    say("converting the tokenizer")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(out)
    if add_bos:
        add_bos_token(out)
    return {
        "architecture": type(model).__name__,
        "tensors": len(state),
        "parameters": int(sum(v.numel() for v in state.values())),
        "dtype": DTYPE,
        "converted_with": {
            "transformers": transformers.__version__,
            "gguf": getattr(gguf_lib, "__version__", None) or _version("gguf"),
            "torch": torch.__version__.split("+")[0],
        },
    }


@contextlib.contextmanager
def _counted(advance: Callable[[int, int], None] | None) -> Iterator[None]:
    """transformers' GGUF reader counts its tensors with a plain tqdm of its own; while it reads, that count goes
    to `advance` instead of a second bar on the terminal."""
    import transformers.modeling_gguf_pytorch_utils as reader

    def counting(items, **_kwargs):
        items = list(items)
        for i, item in enumerate(items):
            yield item
            if advance:
                advance(i + 1, len(items))

    original = reader.tqdm
    reader.tqdm = counting
    try:
        yield
    finally:
        reader.tqdm = original


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def add_bos_token(folder: Path) -> None:
    """Make the saved tokenizer prepend its BOS token: its post-processor in tokenizer.json (what every fast
    tokenizer, vLLM's included, applies) and add_bos_token in tokenizer_config.json. Gemma converted from its
    GGUF adds none, and without it degenerates (shared notes: perplexity 230 against 73 on docs prose)."""
    from tokenizers import Tokenizer, processors

    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    bos = config.get("bos_token")
    if isinstance(bos, dict):
        bos = bos.get("content")
    if not bos:
        raise RuntimeError(f"{config_path} names no bos_token to add")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos_id = tok.token_to_id(bos)
    if bos_id is None:
        raise RuntimeError(f"the tokenizer has no token {bos!r}")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )
    tok.save(str(folder / "tokenizer.json"))
    config["add_bos_token"] = True
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
