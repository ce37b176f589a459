"""Findings about what a run could not measure well, stated instead of left for a reader to notice: a server
that sent no `usage` (token counts, TPOT and throughput unknown) and a share of failed requests above
FAILED_SHARE (the latencies describe only the requests that survived)."""

from __future__ import annotations

from kvbench.records import Finding, PhaseKind, RunRecord
from kvbench.records.findings import FindingKind

# More failed requests than this share of a dtype's fixed load is said in a finding.
FAILED_SHARE = 0.05


def _warning(dtype: str, kind: FindingKind, text: str) -> Finding:
    """A warning about one dtype, its text led by the dtype's name."""
    return Finding(level="warning", kind=kind, dtype=dtype, text=f"{dtype}: {text}")


def notices(record: RunRecord) -> list[Finding]:
    out = []
    for d in record.dtypes:
        fixed = [p for p in d.phases if p.kind == PhaseKind.FIXED]
        completed = sum(p.summary.completed for p in d.phases)
        unknown = sum(int(getattr(p.summary, "completion_tokens_unknown", 0) or 0) for p in d.phases)
        if unknown:
            text = (
                f"the server sent no usage for {unknown:,} of {completed:,} completed requests: their token "
                "counts, TPOT and throughput are unknown (vLLM sends usage; a proxy in front may strip it)"
            )
            out.append(_warning(d.kv_cache_dtype, FindingKind.NO_USAGE, text))
        done = sum(p.summary.completed for p in fixed)
        failed = sum(p.summary.failed for p in fixed)
        if failed and failed > FAILED_SHARE * (done + failed):
            reasons = {}
            for p in fixed:
                for reason, n in p.summary.failure_reasons.items():
                    reasons[reason] = reasons.get(reason, 0) + n
            why = ", ".join(f"{r} x{n}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:3])
            text = (
                f"{failed:,} of {done + failed:,} fixed-load requests failed ({failed / (done + failed):.0%}; "
                f"{why}): its latencies describe only the requests that completed"
            )
            out.append(_warning(d.kv_cache_dtype, FindingKind.FAILED_REQUESTS, text))
    return out
