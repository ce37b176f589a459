"""Energy per phase: NVML power integrated over time on a GPU, RAPL energy counters on a CPU where the kernel
exposes them, and plainly "unavailable" otherwise. Pure functions over samples, plus a RAPL reader.

NVML: power samples (W) at ~10 Hz are integrated with the trapezoid rule over the phase window, per GPU.
The result is valid only if the samples cover the window (first sample within one interval of its start,
last within one interval of its end, coverage >= 90%) and no gap exceeds MAX_GAP_S: a sampler that stalled
for a second would otherwise hide a second of power. RAPL: the package counters' difference (µJ), wrap-around
corrected with max_energy_range_uj.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

MIN_COVERAGE = 0.9
MAX_GAP_S = 0.5
POWERCAP = Path("/sys/class/powercap")


@dataclass
class Energy:
    """Energy over one phase, all GPUs (or the CPU package) summed."""

    source: str  # "nvml", "rapl" or "unavailable"
    valid: bool
    reason: str | None = None
    joules: float | None = None
    seconds: float | None = None
    avg_watts: float | None = None
    coverage: float | None = None  # share of the window the samples span (NVML)
    max_gap_s: float | None = None
    devices: int = 0
    j_per_output_token: float | None = None
    j_per_total_token: float | None = None

    def per_token(self, output_tokens: int | None, total_tokens: int | None) -> Energy:
        if self.valid and self.joules is not None:
            self.j_per_output_token = self.joules / output_tokens if output_tokens else None
            self.j_per_total_token = self.joules / total_tokens if total_tokens else None
        return self

    def as_dict(self) -> dict:
        return asdict(self)


def trapezoid(times: list[float], watts: list[float], start: float, end: float) -> tuple[float, float, float]:
    """(joules, coverage, largest gap in s) of power samples over [start, end]: samples inside the window
    plus the window's edges, interpolated linearly from the neighbouring samples (held at the nearest sample
    outside the data)."""
    pts = sorted((t, w) for t, w in zip(times, watts, strict=False) if math.isfinite(w))
    if not pts or end <= start:
        return 0.0, 0.0, math.inf

    def at(t: float) -> float:
        if t <= pts[0][0]:
            return pts[0][1]
        if t >= pts[-1][0]:
            return pts[-1][1]
        for (t0, w0), (t1, w1) in zip(pts, pts[1:], strict=False):
            if t0 <= t <= t1:
                return w0 + (w1 - w0) * (t - t0) / (t1 - t0) if t1 > t0 else w0
        return pts[-1][1]

    inside = [(t, w) for t, w in pts if start < t < end]
    series = [(start, at(start)), *inside, (end, at(end))]
    joules = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(series, series[1:], strict=False))
    covered_from, covered_to = max(start, pts[0][0]), min(end, pts[-1][0])
    coverage = max(0.0, covered_to - covered_from) / (end - start)
    # gaps between the samples that bracket the window (a window edge counts as a gap when no sample precedes
    # or follows it), clipped to the window
    before = [t for t, _ in pts if t < start]
    after = [t for t, _ in pts if t > end]
    seq = [before[-1] if before else start, *(t for t, _ in pts if start <= t <= end), after[0] if after else end]
    gap = max(max(0.0, min(b, end) - max(a, start)) for a, b in zip(seq, seq[1:], strict=False))
    return joules, coverage, gap


def nvml_energy(samples: list[list[float]], fields: list[str], start: float, end: float) -> Energy:
    """Energy of every GPU over [start, end] from NvmlSampler rows (fields: t, gpu, ..., power_w, ...)."""
    if not samples:
        return Energy("nvml", False, "no NVML samples in this phase")
    ti, gi, pi = fields.index("t"), fields.index("gpu"), fields.index("power_w")
    by_gpu: dict[int, tuple[list[float], list[float]]] = {}
    for row in samples:
        t, w = row[ti], row[pi]
        if start - 1.0 <= t <= end + 1.0:  # neighbours just outside interpolate the edges
            ts, ws = by_gpu.setdefault(int(row[gi]), ([], []))
            ts.append(t)
            ws.append(w)
    if not by_gpu:
        return Energy("nvml", False, "no NVML samples in this phase")
    joules, coverages, gaps = 0.0, [], []
    for ts, ws in by_gpu.values():
        j, cov, gap = trapezoid(ts, ws, start, end)
        joules += j
        coverages.append(cov)
        gaps.append(gap)
    coverage, gap = min(coverages), max(gaps)
    seconds = end - start
    reason = None
    if coverage < MIN_COVERAGE:
        reason = f"power samples cover {coverage:.0%} of the phase (< {MIN_COVERAGE:.0%})"
    elif gap > MAX_GAP_S:
        reason = f"a {gap:.2f} s gap between power samples (> {MAX_GAP_S} s)"
    return Energy(
        "nvml",
        reason is None,
        reason,
        joules,
        seconds,
        joules / seconds if seconds else None,
        coverage,
        gap,
        len(by_gpu),
    )


# -- RAPL (CPU package energy counters) ---------------------------------------------------------------------


def rapl_domains(root: Path = POWERCAP) -> list[Path]:
    """Top-level RAPL package domains (intel-rapl:N; AMD exposes the same interface), or []."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1 and (p / "energy_uj").is_file())


def rapl_read(domains: list[Path]) -> list[tuple[int, int]] | None:
    """(energy µJ, max range µJ) per domain, or None when a counter cannot be read (not root, lockdown)."""
    try:
        return [(int((d / "energy_uj").read_text()), int((d / "max_energy_range_uj").read_text())) for d in domains]
    except (OSError, ValueError):
        return None


def rapl_energy(before: list[tuple[int, int]] | None, after: list[tuple[int, int]] | None, seconds: float) -> Energy:
    if before is None or after is None or not before:
        return unavailable()
    joules = 0.0
    for (e0, rng), (e1, _) in zip(before, after, strict=False):
        delta = e1 - e0 if e1 >= e0 else e1 + rng - e0  # the counter wrapped
        joules += delta / 1e6
    return Energy("rapl", True, None, joules, seconds, joules / seconds if seconds else None, 1.0, 0.0, len(before))


def unavailable(root: Path = POWERCAP) -> Energy:
    why = (
        f"no RAPL energy counters under {root} (this kernel or VM does not expose them)"
        if not rapl_domains(root)
        else f"RAPL counters under {root} are not readable by this user"
    )
    return Energy("unavailable", False, why)
