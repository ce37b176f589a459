"""What a kernel sweep records about the GPU besides times: a 10 Hz NVML trace through the whole grid, with
the phases (and each timed case's achieved GB/s) marked on the trace's clock, and device memory as torch, NVML
and the catalog (kvbench/data/gpus.toml) each state it.

The sampler is the harness's (kvbench/core/telemetry.py): one NVML reader for every record kvbench writes. Without
a GPU nothing is sampled and the record says "no GPU: not collected".
"""

from __future__ import annotations

import time

import torch

from kvbench.core.telemetry import NvmlSampler

NO_GPU = "no GPU: not collected (Triton interpreter on the CPU)"
MIB, GIB = 1 << 20, 1 << 30


class Trace:
    """The NVML sampler (on a GPU) plus marked phases, both on time.perf_counter()'s clock."""

    def __init__(self, dev: torch.device):
        self.dev = dev
        self.phases: list[dict] = []
        self.sampler = NvmlSampler(0.1, [dev.index or 0]) if dev.type == "cuda" else None
        self.t0 = time.perf_counter()

    def __enter__(self) -> Trace:
        if self.sampler:
            self.sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.sampler:
            self.sampler.stop()

    def mark(self, name: str, t_start: float, **extra) -> None:
        """A phase or a timed case that ran from t_start (perf_counter) until now."""
        self.phases.append({"name": name, "t_start": t_start, "t_end": time.perf_counter(), **extra})

    def as_dict(self) -> dict:
        nvml = self.sampler.result.as_dict() if self.sampler else {"available": False, "reason": NO_GPU}
        return {"interval_s": None, "fields": [], "samples": [], **nvml, "phases": self.phases, "t_origin": self.t0}


def _nvml_memory(index: int) -> dict:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no package, no driver: say so
        return {"available": False, "reason": f"NVML unavailable: {exc}"}
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
        return {
            "available": True,
            "total_bytes": int(info.total),
            "free_bytes": int(info.free),
            "used_bytes": int(info.used),
        }
    except Exception as exc:
        return {"available": False, "reason": f"NVML memory query failed: {exc}"}
    finally:
        pynvml.nvmlShutdown()


def device_memory(dev: torch.device, card) -> dict:
    """torch.cuda.mem_get_info's total/free against NVML's and the catalog's figures for this GPU, with the
    differences in MiB (what vLLM's gpu_memory_utilization is a fraction of is torch's total)."""
    if dev.type != "cuda":
        return {"available": False, "reason": NO_GPU}
    free, total = torch.cuda.mem_get_info(dev)
    nvml = _nvml_memory(dev.index or 0)
    cat = None
    if card is not None:
        cat = {
            "key": card.key,
            "spec_bytes": card.spec_memory_bytes,
            "device_memory_bytes": card.device_memory_bytes,
            "torch_total_bytes": card.torch_total_gib * GIB if card.torch_total_gib else None,
            "torch_total_source": card.torch_total_source,
        }
    diff = {}
    if cat:
        diff["torch_minus_catalog_torch_mib"] = (
            (total - cat["torch_total_bytes"]) / MIB if cat["torch_total_bytes"] else None
        )
        diff["torch_minus_catalog_device_mib"] = (total - cat["device_memory_bytes"]) / MIB
    if nvml.get("available"):
        diff["nvml_minus_torch_mib"] = (nvml["total_bytes"] - total) / MIB
        if cat:
            diff["nvml_minus_catalog_device_mib"] = (nvml["total_bytes"] - cat["device_memory_bytes"]) / MIB
    return {
        "available": True,
        "torch": {"total_bytes": int(total), "free_bytes": int(free)},
        "nvml": nvml,
        "catalog": cat,
        "differences_mib": diff,
        "torch_max_allocated_bytes": None,  # filled in after the grid
    }
