"""What a finding is about, as an enum: pages, reports and gates switch on `Finding.kind`, never on its text.

Records written before findings had kinds (kvbench.run/1 and early kvbench.run/2) get one on load from what
the finding holds: the "not honoured" finding carried its engine and format ratios, the others their fixed
wording. What cannot be told is `other`.

It also builds the findings a run derives from its record when it finishes (a starved client, a dtype not
honoured); the verdict (kvbench/verdict.py) and harness/notices.py add theirs.
"""

from __future__ import annotations

from enum import StrEnum


class FindingKind(StrEnum):
    NOT_HONOURED = "not-honoured"  # the engine's KV capacity contradicts the dtype's format: another dtype ran
    UNCONFIRMED = "unconfirmed"  # the server did not say (or contradicted) which KV dtype it runs
    ACCURACY = "accuracy"  # task accuracy inferior or undecided against the budget (kvbench.verdict_accuracy)
    CANARY = "canary"  # greedy canaries came back different under load more often than auto's
    UNSUPPORTED = "unsupported"  # the installed vLLM does not accept the dtype: recorded, not run
    EMULATED = "emulated"  # the cache format is emulated: accuracy and capacity count, its speed does not
    FAILED = "failed"  # the dtype's run failed or stopped part-way
    DEGENERATE = "degenerate"  # outputs that are not text (repeats, empty) under a failure-mode condition
    STARVED_CLIENT = "starved-client"  # the load generator waited for a CPU: its latencies include its queueing
    SERVER_CHANGED = "server-changed"  # an --endpoint server's model or cache config changed between phases
    NO_USAGE = "no-usage"  # the server sent no usage: token counts, TPOT and throughput unknown
    FAILED_REQUESTS = "failed-requests"  # more than a small share of the fixed load failed
    ERROR = "error"  # kvbench could not derive its findings (a bug; what was measured is kept)
    OTHER = "other"  # an older record's finding whose kind its text does not tell


def legacy_kind(finding: dict) -> FindingKind:
    """The kind of a finding from a record that did not store one."""
    text = str(finding.get("text") or "").lower()
    if "engine_ratio" in finding and "format_ratio" in finding or "not honoured" in text:
        return FindingKind.NOT_HONOURED
    if "waited for a cpu" in text:
        return FindingKind.STARVED_CLIENT
    if "findings not derived" in text:
        return FindingKind.ERROR
    if "excluded from the recommendation" in text:
        return FindingKind.CANARY if "canaries came back" in text else FindingKind.ACCURACY
    return FindingKind.OTHER


def parse_kind(finding: dict) -> FindingKind:
    """A stored kind (an unknown one from a newer kvbench reads as `other`), else the legacy derivation."""
    kind = finding.get("kind")
    if kind is None:
        return legacy_kind(finding)
    try:
        return FindingKind(kind)
    except ValueError:
        return FindingKind.OTHER


# -- the findings a run derives from its record (harness/runner.py, when it finishes) ----------------------

# A client that waited for a CPU this share of a phase measured its own queueing, not the server.
STARVED_CLIENT_FRACTION = 0.05


def findings(record, spec) -> list:
    """Loud, plain-language findings (records.Finding) from a run's record: a starved client, dtypes the
    platform probably did not honour (spec: the model's, None when its config is not on disk)."""
    return [*starved_client(record), *not_honoured(record, spec)]


def not_honoured(record, spec) -> list:
    """A warning for each dtype whose engine capacity contradicts its format (capacitychecks.off_format)."""
    # imported here: records imports this module for FindingKind
    from kvbench.harness.capacitychecks import HONOURED_TOLERANCE, off_format
    from kvbench.harness.records import Finding

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
    from kvbench.harness.records import Finding

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
