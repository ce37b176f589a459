"""What a finding is about, as an enum: pages, reports and gates switch on `Finding.kind`, never on its text.

Records written before findings had kinds (kvbench.run/1 and early kvbench.run/2) get one on load from what
the finding holds: the "not honoured" finding carried its engine and format ratios, the others their fixed
wording. What cannot be told is `other`.

The findings a run derives from its record when it finishes are built in harness/run/runfindings.py; the verdict
(kvbench/analysis/verdict.py) and harness/run/notices.py add theirs. This module is the record's vocabulary only, so the
record (kvbench/records/) can import it without importing what derives findings.
"""

from __future__ import annotations

from enum import StrEnum


class FindingKind(StrEnum):
    NOT_HONOURED = "not-honoured"  # the engine's KV capacity contradicts the dtype's format: another dtype ran
    UNCONFIRMED = "unconfirmed"  # the server did not say (or contradicted) which KV dtype it runs
    ACCURACY = "accuracy"  # task accuracy inferior or undecided against the budget (kvbench.analysis.verdict_accuracy)
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
    SCALES = "scales"  # a quantized dtype's KV scales are zero, not finite, negative, missing or not loaded
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


# The kinds of degenerate answer a record counts per condition (harness/quality/failuremodes.py counts them, the verdict
# compares them with auto's).
DEGENERATE_KINDS = ("empty", "repeated", "id-0")
