"""The findings a run derives from its record when it finishes (harness/run/runner.py): a load generator starved
of CPU, dtypes the platform probably did not honour, and KV scales that are wrong or not the ones asked for."""

from __future__ import annotations

from kvbench.harness.server.capacitychecks import HONOURED_TOLERANCE, off_format
from kvbench.records import Finding
from kvbench.records.findings import FindingKind

# A client that waited for a CPU this share of a phase measured its own queueing, not the server.
STARVED_CLIENT_FRACTION = 0.05


def findings(record, spec) -> list:
    """Loud, plain-language findings (records.Finding) from a run's record: a starved client, dtypes the
    platform probably did not honour (spec: the model's, None when its config is not on disk)."""
    return [*starved_client(record), *not_honoured(record, spec), *scale_problems(record)]


def scale_problems(record) -> list:
    """A warning per dtype whose KV scales are wrong (zero, not finite, negative, missing for some layers, or held
    by the checkpoint without a method that loads them: harness/server/scales.py), and per variant whose scales did not
    come from where it asked (a calibrated copy vLLM did not load its scales from)."""
    out = []
    for d in record.dtypes:
        block = d.scales or {}
        texts = [f"KV scales: {p}" for p in block.get("problems") or []]
        if block.get("variant") == "calibrated" and block.get("source") not in (None, "checkpoint"):
            texts.append(f"kvbench's calibrated scales were not what the server used ({block.get('why')})")
        out += [
            Finding(level="warning", kind=FindingKind.SCALES, dtype=d.kv_cache_dtype, text=f"{d.kv_cache_dtype}: {t}")
            for t in texts
        ]
    return out


def not_honoured(record, spec) -> list:
    """A warning for each dtype whose engine capacity contradicts its format (capacitychecks.off_format)."""
    return [
        Finding(
            level="warning",
            kind=FindingKind.NOT_HONOURED,
            dtype=dtype,
            engine_ratio=actual,
            format_ratio=expected,
            text=(
                f"{dtype} was probably NOT honoured on this platform: the engine holds "
                f"{actual:.2f}x the tokens of auto, but the {dtype} format implies {expected:.2f}x "
                f"({abs(actual / expected - 1) * 100:.0f}% off; tolerance {HONOURED_TOLERANCE * 100:.0f}%)."
            ),
        )
        for dtype, actual, expected in off_format(record, spec)
    ]


def starved_client(record) -> list:
    """A warning when the load generator waited for a CPU more than STARVED_CLIENT_FRACTION of a phase."""
    worst = (0.0, None, None)
    for d in record.dtypes:
        for phase in d.phases:
            frac = phase.summary.client_runqueue_wait_fraction or 0.0
            if frac > worst[0]:
                worst = (frac, d.kv_cache_dtype, phase.name)
    frac, dtype, name = worst
    if frac <= STARVED_CLIENT_FRACTION:
        return []
    return [
        Finding(
            level="warning",
            kind=FindingKind.STARVED_CLIENT,
            dtype=dtype,
            text=(
                f"the load generator waited for a CPU {frac:.0%} of phase {name} ({dtype}): "
                "its latencies include its own queueing. Run on a quieter machine, "
                "or with --realtime (SCHED_FIFO; needs root or CAP_SYS_NICE)."
            ),
        )
    ]
