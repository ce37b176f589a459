"""The embedded CPU default model: a tiny Llama built locally (random weights, a BPE tokenizer trained
here on a generated corpus), cached in the user cache dir and rebuilt on demand. No hub access.

Its shape is chosen for vLLM's CPU backend: head_dim 32 (FP8 KV on CPU needs head_size divisible by
32) and divisible by 16 (NVFP4 blocks), so every KV dtype can at least be asked for.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import platformdirs

NAME = "kvbench-tiny-llama"
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
SEED = 0
# Bump when the build recipe changes, so cached copies are rebuilt.
RECIPE = "1"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def fingerprint() -> str:
    blob = json.dumps({"config": CONFIG, "seed": SEED, "recipe": RECIPE}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cache_root() -> Path:
    return Path(os.environ.get("KVBENCH_CACHE_DIR") or platformdirs.user_cache_dir("kvbench"))


def model_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / f"{NAME}-{fingerprint()}"


def ensure_tiny_model(root: Path | None = None, rebuild: bool = False) -> Path:
    """Path to the tiny model, building it first if it is missing, incomplete or `rebuild`."""
    dest = model_dir(root)
    if rebuild and dest.exists():
        shutil.rmtree(dest)
    if (dest / "BUILD_OK").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename: a crash never leaves a half-built model behind.
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=dest.parent))
    try:
        _build(tmp)
        (tmp / "BUILD_OK").write_text(fingerprint() + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def corpus(n_sentences: int = 4000, seed: int = SEED) -> list[str]:
    """A generated pseudo-English corpus: deterministic, offline, enough to train a small BPE."""
    rng = random.Random(seed)
    onsets = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "ch", "sh"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
    codas = ["", "n", "r", "s", "t", "l", "nd", "st"]
    words = sorted({"".join(rng.choice(x) for x in (onsets, vowels, codas)) * rng.choice([1, 1, 2]) for _ in range(3000)})
    common = ["the", "a", "of", "and", "to", "in", "is", "that", "for", "on", "with", "as", "cache", "token", "model"]
    lines = []
    for _ in range(n_sentences):
        n = rng.randint(5, 16)
        sentence = [rng.choice(common) if rng.random() < 0.3 else rng.choice(words) for _ in range(n)]
        lines.append(" ".join(sentence).capitalize() + rng.choice([".", ".", ".", "?", "!"]))
    return lines


def _build(path: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", model_max_length=CONFIG["max_position_embeddings"]
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)

    config = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")}
    config["vocab_size"] = len(fast)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
