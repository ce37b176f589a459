"""The embedded CPU default model: a tiny Llama built locally (random weights, a BPE tokenizer trained
here on a generated corpus), cached in the user cache dir and rebuilt on demand. No hub access.

Its shape is chosen for vLLM's CPU backend: head_dim 32 (FP8 KV on CPU needs head_size divisible by
32) and divisible by 16 (NVFP4 blocks), so every KV dtype can at least be asked for.
"""

from __future__ import annotations

import functools
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
RECIPE = "2"  # 2: digits one per token, BOS prepended, task phrases in the corpus
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
    """The random-weight build's folder."""
    return (root or cache_root()) / f"{NAME}-{fingerprint()}"


def trained_dir(root: Path | None = None) -> Path:
    """The trained build's folder, beside the random one (same tokenizer recipe, its own fingerprint)."""
    from kvbench.harness import tinytrain

    return (root or cache_root()) / f"{NAME}-trained-{tinytrain.fingerprint()}"


def ensure_tiny_model(root: Path | None = None, rebuild: bool = False) -> Path:
    """Path to the random-weight tiny model (tests that need flat logits), built first if missing or `rebuild`."""
    return _ensure(model_dir(root), _build, fingerprint(), rebuild)


def ensure_trained_model(root: Path | None = None, rebuild: bool = False, log=None) -> Path:
    """Path to the trained tiny model that the CPU default serves, trained first (a few minutes on 2 cores) if
    missing, incomplete or `rebuild`. Its training report is `training_report.json` in the folder."""
    from kvbench.harness import tinytrain

    dest = trained_dir(root)
    return _ensure(dest, lambda path: tinytrain.build(path, log=log), tinytrain.fingerprint(), rebuild)


def default_model(root: Path | None = None) -> Path:
    """What the CPU default serves: the trained build."""
    return ensure_trained_model(root)


def _ensure(dest: Path, build, stamp: str, rebuild: bool) -> Path:
    if rebuild and dest.exists():
        shutil.rmtree(dest)
    if (dest / "BUILD_OK").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename: a crash never leaves a half-built model behind.
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        build(tmp)
        (tmp / "BUILD_OK").write_text(stamp + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


ONSETS = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "ch", "sh"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
CODAS = ["", "n", "r", "s", "t", "l", "nd", "st"]
COMMON = ["the", "a", "of", "and", "to", "in", "is", "that", "for", "on", "with", "as", "cache", "token", "model"]


@functools.cache
def corpus_words(seed: int = SEED) -> list[str]:
    """The generated pseudo-English vocabulary (sorted, deterministic from `seed`)."""
    rng = random.Random(seed)
    return sorted(
        {"".join(rng.choice(x) for x in (ONSETS, VOWELS, CODAS)) * rng.choice([1, 1, 2]) for _ in range(3000)}
    )


def sentence(rng: random.Random, vocab: list[str]) -> str:
    n = rng.randint(5, 16)
    words = [rng.choice(COMMON) if rng.random() < 0.3 else rng.choice(vocab) for _ in range(n)]
    return " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"])


def corpus(n_sentences: int = 4000, seed: int = SEED) -> list[str]:
    """A generated pseudo-English corpus: deterministic, offline, enough to train a small BPE. The words of
    the retrieval tasks' fixed phrases and digits are in it too, so those phrases get short encodings."""
    from kvbench import evaltasks

    rng = random.Random(seed)
    vocab = corpus_words(seed)
    lines = [sentence(rng, vocab) for _ in range(n_sentences)]
    for _ in range(n_sentences // 20):
        key, name = str(rng.randrange(10**4, 10**5)), rng.choice(vocab)
        lines.append(evaltasks.PASSKEY_INTRO + evaltasks.PASSKEY_NEEDLE.format(key=key) + evaltasks.PASSKEY_QUESTION)
        lines.append(
            evaltasks.MULTIKEY_INTRO
            + evaltasks.MULTIKEY_NEEDLE.format(name=name, key=key)
            + evaltasks.MULTIKEY_QUESTION.format(name=name)
        )
    return lines


def build_tokenizer(path: Path):
    """Train the BPE tokenizer on the generated corpus and save it (with the chat template) into `path`.
    Digits are split one per token, so a pass key's digits are exact tokens; a BOS is prepended as Llama's is."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=CONFIG["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast


def llama_config(vocab_size: int):
    from transformers import LlamaConfig

    config = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")}
    config["vocab_size"] = vocab_size
    return LlamaConfig(**config)


def _build(path: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM

    fast = build_tokenizer(path)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(llama_config(len(fast))).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
