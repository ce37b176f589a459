"""GPU telemetry from NVML (nvidia-ml-py) at >= 10 Hz, on the same clock as request timings.

No NVML (no driver, no GPU, package missing) is recorded as unavailable with the reason, never an error.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

FIELDS = (
    "t",  # time.perf_counter(), s
    "gpu",  # index
    "memory_used_bytes",
    "power_w",
    "sm_util_pct",
    "mem_util_pct",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temperature_c",
)


@dataclass
class Telemetry:
    available: bool
    reason: str | None = None
    interval_s: float | None = None
    fields: tuple[str, ...] = FIELDS
    samples: list[list[float]] = field(default_factory=list)  # rows in FIELDS order

    def as_dict(self) -> dict:
        return {
            "available": self.available,
            "reason": self.reason,
            "interval_s": self.interval_s,
            "fields": list(self.fields),
            "samples": self.samples,
        }


class NvmlSampler:
    """Background thread sampling every visible GPU (or `indices`) until stopped."""

    def __init__(self, interval_s: float = 0.1, indices: list[int] | None = None):
        if interval_s > 0.1:
            raise ValueError("NVML sampling must run at 10 Hz or faster (interval_s <= 0.1)")
        self.interval_s = interval_s
        self.indices = indices
        self.result = Telemetry(available=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handles: list = []

    def start(self) -> NvmlSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
        except ImportError:
            self.result = Telemetry(False, "nvidia-ml-py is not installed")
            return self
        except Exception as exc:
            self.result = Telemetry(False, f"NVML unavailable: {exc}")
            return self
        self._nvml = pynvml
        indices = self.indices if self.indices is not None else range(pynvml.nvmlDeviceGetCount())
        self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        if not self._handles:
            pynvml.nvmlShutdown()
            self.result = Telemetry(False, "NVML found no GPU")
            return self
        self.result = Telemetry(True, interval_s=self.interval_s)
        self._thread = threading.Thread(target=self._run, name="kvbench-nvml", daemon=True)
        self._thread.start()
        return self

    def _sample(self, index: int, handle) -> list[float]:
        nv = self._nvml

        def read(fn, *args, scale=1.0):
            try:
                return fn(handle, *args) * scale
            except nv.NVMLError:
                return float("nan")  # a counter this GPU does not expose

        util = None
        try:
            util = nv.nvmlDeviceGetUtilizationRates(handle)
        except nv.NVMLError:
            pass
        return [
            time.perf_counter(),
            index,
            float(nv.nvmlDeviceGetMemoryInfo(handle).used),
            read(nv.nvmlDeviceGetPowerUsage, scale=1e-3),  # mW -> W
            float(util.gpu) if util else float("nan"),
            float(util.memory) if util else float("nan"),
            read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
            read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
            read(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
        ]

    def _run(self) -> None:
        next_t = time.perf_counter()
        while not self._stop.is_set():
            for index, handle in self._handles:
                try:
                    self.result.samples.append(self._sample(index, handle))
                except Exception:  # GPU fell off the bus mid-run: keep what we have
                    self._stop.set()
                    break
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.perf_counter()))

    def stop(self) -> Telemetry:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
        return self.result

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
