"""Which machine this is: the nightly config section for its GPU (or the CPU) and its results folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import UsageError
from kvbench.orchestration.nightly.config import CPU, NightlyConfig


@dataclass
class Target:
    key: str  # the config section: a GPU catalog key or "cpu"
    machine: str  # the results folder (results/<machine>/)
    gpus_found: int
    gpu_name: str | None


def detect(cfg: NightlyConfig, tensor_parallel: dict[str, int] | None = None) -> Target:
    """The config section for this machine's GPU (NVML name -> catalog key), or "cpu" without one."""
    from kvbench.specs.gpus import match_nvml_name
    from kvbench.specs.machine import machine_name, nvml_gpus

    gpus, _ = nvml_gpus()
    if not gpus:
        key, name = CPU, None
    else:
        name = gpus[0]["name"]
        spec = match_nvml_name(name)
        if spec is None:
            raise UsageError(
                f"GPU {name!r} is not in kvbench's catalog (kvbench/data/gpus.toml): "
                "add it there and a [machines.<key>] section"
            )
        key = spec.key
    if key not in cfg.machines:
        raise UsageError(
            f"this machine's {'GPU ' + repr(name) + ' (' + key + ')' if name else 'CPU'} has no [machines.{key}] "
            f"section in the nightly config; configured: {', '.join(cfg.machines)}"
        )
    tp, nodes = cfg.machines[key].tensor_parallel_size, cfg.machines[key].nodes
    if gpus and len(gpus) < tp:
        raise UsageError(f"[machines.{key}] wants tensor_parallel_size {tp}, but NVML finds {len(gpus)} GPU(s)")
    # a multi-node server spans tp x nodes GPUs: the folder is named for all of them
    # (kvbench.orchestration.nightly.nodes)
    return Target(key, machine_name(tp * nodes if gpus else 1), len(gpus), name)


def results_dir_of(asv_conf: Path) -> Path:
    """Where records and history go: the asv config's results_dir (so asv and the harness agree)."""
    from kvbench.orchestration.asvrun import AsvProject

    return AsvProject.load_as(asv_conf, "--asv-config").results_dir
