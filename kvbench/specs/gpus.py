"""GPU catalog (kvbench/data/gpus.toml) and vLLM's per-device server defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.core.datafiles import entry_error, load_toml
from kvbench.core.errors import unknown_choice
from kvbench.core.units import GiB, MiB


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    nvml_names: tuple[str, ...]
    memory_gb: float  # spec sheet, decimal GB
    device_memory_mib: int  # what the driver reports; vLLM's basis
    hbm_bandwidth_gbs: float
    sm: int
    sm_count: int
    native_fp8: bool
    native_fp4: bool
    source: str
    torch_total_gib: float | None = None  # what torch reports (vLLM's total_memory); None: not seen yet
    torch_total_source: str | None = None

    @property
    def device_memory_bytes(self) -> int:
        return self.device_memory_mib * MiB

    @property
    def torch_total_bytes(self) -> float:
        """vLLM's basis: the total torch reports, else the driver's total (a little more than torch sees)."""
        return self.torch_total_gib * GiB if self.torch_total_gib else float(self.device_memory_bytes)

    @property
    def torch_total_how(self) -> str:
        if self.torch_total_gib:
            return f"as torch reports it ({self.torch_total_source})"
        return "nvidia-smi total (torch's figure not on record for this GPU; it reports ~0.5 GiB less)"

    @property
    def spec_memory_bytes(self) -> float:
        return self.memory_gb * 1e9


def catalog() -> dict[str, GpuSpec]:
    raw = load_toml("gpus.toml")
    out = {}
    for key, v in raw.items():
        if not isinstance(v, dict):
            continue
        try:
            gpu = GpuSpec(
                key=key,
                name=v["name"],
                nvml_names=tuple(v.get("nvml_names", ())),
                memory_gb=float(v["memory_gb"]),
                device_memory_mib=int(v["device_memory_mib"]),
                hbm_bandwidth_gbs=float(v["hbm_bandwidth_gbs"]),
                sm=int(v["sm"]),
                sm_count=int(v["sm_count"]),
                native_fp8=bool(v["native_fp8"]),
                native_fp4=bool(v["native_fp4"]),
                source=v["source"],
                torch_total_gib=float(v["torch_total_gib"]) if "torch_total_gib" in v else None,
                torch_total_source=v.get("torch_total_source"),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # an overlay's entry: one line (N-P12)
            raise entry_error("gpus.toml", "", key, exc) from None
        if not (math.isfinite(gpu.memory_gb) and gpu.memory_gb > 0 and gpu.device_memory_mib > 0):
            raise entry_error("gpus.toml", "", key, "needs memory_gb and device_memory_mib above 0")
        out[key] = gpu
    return out


def get_gpu(key: str) -> GpuSpec:
    gpus = catalog()
    try:
        return gpus[key]
    except KeyError:
        raise unknown_choice("GPU", key, gpus) from None


def parse_gpu_list(text: str, flag: str = "--gpus") -> list[GpuSpec]:
    from kvbench.core import cliargs

    return [get_gpu(name) for name in cliargs.names(text, flag, "h100-sxm,h200")]


def match_nvml_name(nvml_name: str) -> GpuSpec | None:
    """The catalog entry for a name NVML reports (e.g. 'NVIDIA H100 80GB HBM3'), if any."""
    for gpu in catalog().values():
        if nvml_name in gpu.nvml_names:
            return gpu
    return None
