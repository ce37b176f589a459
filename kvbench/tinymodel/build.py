"""The embedded CPU default model: a tiny Llama with a BPE tokenizer trained here on a generated corpus. No hub
access.

The trained weights the CPU default serves are committed (kvbench/data/tinymodel/, 1.3 MiB) with their
sha256 (kvbench/data/tinymodel.sha256): every machine serves the same bytes, so two CPUs' runs of one commit
measure the same model. `kvbench tinymodel train --out DIR` reruns the recipe (kvbench/data/tinymodel.toml)
and `kvbench tinymodel verify` checks hashes; nothing trains at run time.

A random-weight build of the same shape (`ensure_tiny_model`, cached in the user cache dir and rebuilt on
demand) is for tests that need a server whose logits mean nothing.

Its shape is chosen for vLLM's CPU backend: head_dim 32 (FP8 KV on CPU needs head_size divisible by
32) and divisible by 16 (NVFP4 blocks), so every KV dtype can at least be asked for.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import shutil
import tempfile
from pathlib import Path

from kvbench.core.datafiles import cache_root, data_path
from kvbench.core.errors import KvbenchError
from kvbench.core.tinyconfig import CONFIG, NAME, SPEC
from kvbench.specs.corpus import corpus_words, sentence

SEED = SPEC["model"]["init_seed"]
COMMITTED = "tinymodel"  # the trained model's folder under kvbench/data/
SHA256_FILE = "tinymodel.sha256"  # its files' sha256, `sha256sum -c` format, beside it
# Bump when the random build's recipe changes, so cached copies are rebuilt.
RECIPE = "3"  # 3: shape from kvbench/data/tinymodel.toml; 2: digits one per token, BOS prepended
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def fingerprint() -> str:
    blob = json.dumps({"config": CONFIG, "seed": SEED, "recipe": RECIPE}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def model_dir(root: Path | None = None) -> Path:
    """The random-weight build's folder."""
    return (root or cache_root()) / f"{NAME}-{fingerprint()}"


def committed_dir() -> Path:
    """The committed trained model (package data)."""
    return data_path(COMMITTED)


def recorded_sha256() -> dict[str, str]:
    """File name -> sha256 of the committed trained model, as kvbench/data/tinymodel.sha256 records them."""
    out = {}
    for line in data_path(SHA256_FILE).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split(maxsplit=1)
            out[name.lstrip("*")] = digest
    return out


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def verify(folder: Path | None = None) -> dict[str, tuple[str, str | None]]:
    """Each recorded file -> (recorded sha256, the folder's: None if missing), for the files that differ."""
    folder = Path(folder) if folder is not None else committed_dir()
    bad = {}
    for name, digest in recorded_sha256().items():
        path = folder / name
        actual = sha256_of(path) if path.is_file() else None
        if actual != digest:
            bad[name] = (digest, actual)
    return bad


@functools.cache
def _checked_committed() -> Path:
    path = committed_dir()
    bad = verify(path)
    if bad:
        names = ", ".join(f"{n} ({'missing' if a is None else 'sha256 ' + a[:12]})" for n, (_, a) in bad.items())
        raise KvbenchError(
            f"the committed tiny model in {path} does not match {SHA256_FILE}: {names}; "
            "restore it from git (git checkout -- kvbench/data/tinymodel)"
        )
    return path


def ensure_tiny_model(root: Path | None = None, rebuild: bool = False) -> Path:
    """Path to the random-weight tiny model (tests that need flat logits), built first if missing or `rebuild`."""
    return _ensure(model_dir(root), _build, fingerprint(), rebuild)


def ensure_trained_model(root: Path | None = None, rebuild: bool = False, log=None) -> Path:
    """Path to the trained tiny model the CPU default serves: the committed one, its sha256 checked (once per
    process). Nothing is trained here; `root`, `rebuild` and `log` are accepted for the old callers."""
    return _checked_committed()


def default_model(root: Path | None = None) -> Path:
    """What the CPU default serves: the committed trained model."""
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


def corpus(n_sentences: int = 4000, seed: int = SEED) -> list[str]:
    """A generated pseudo-English corpus: deterministic, offline, enough to train a small BPE. The words of
    the retrieval tasks' fixed phrases and digits are in it too, so those phrases get short encodings."""
    from kvbench.specs import evaltasks

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


def save(model, path: Path) -> None:
    """The model's config.json and model.safetensors (bf16, as served), written so that the same weights give
    the same bytes on any machine and version: our own config dict (save_pretrained adds the transformers
    version), tensors in name order with safetensors' plain metadata."""
    import torch
    from safetensors.torch import save_file

    config = dict(CONFIG, vocab_size=model.config.vocab_size)
    (Path(path) / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in sorted(model.state_dict().items())}
    save_file(state, str(Path(path) / "model.safetensors"), metadata={"format": "pt"})


def _build(path: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM

    fast = build_tokenizer(path)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(llama_config(len(fast)))
    save(model, path)


# A second locally built model, of another shape than the tiny Llama: Qwen3's architecture and attention
# (16 query heads, 8 KV heads, head_dim 128, q/k norms, tied embeddings, as Qwen3-0.6B) in 2 small layers with
# random weights. It exercises what a user's own model does on the CPU default: a KV budget sized from the
# model, vLLM's head-size-128 attention paths, GQA with 8 KV heads.
GQA_NAME = "kvbench-tiny-qwen3-gqa"
GQA_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def gqa_model_dir(root: Path | None = None) -> Path:
    blob = json.dumps({"config": GQA_CONFIG, "seed": SEED, "tokenizer": RECIPE}, sort_keys=True)
    return (root or cache_root()) / f"{GQA_NAME}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def ensure_gqa_model(root: Path | None = None, rebuild: bool = False) -> Path:
    """Path to the GQA test model (random weights, the tiny tokenizer), built first if missing or `rebuild`."""
    return _ensure(gqa_model_dir(root), build_gqa_model, GQA_NAME, rebuild)


def build_gqa_model(path: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fast = build_tokenizer(path)
    config = {k: v for k, v in GQA_CONFIG.items() if k not in ("architectures", "model_type")}
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(Qwen3Config(**config, vocab_size=len(fast)))
    model.to(torch.bfloat16).save_pretrained(path)
