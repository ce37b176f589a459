"""The peer check's verdict: one client against the reference, round by round, as (subject - reference) /
reference in percent; the median over rounds of the paired differences is the verdict, the difference of the
per-client medians is reported beside it. `table` prints a comparison.
"""

from __future__ import annotations

import statistics

COMPARED = (
    ("ttft_p50_ms", "TTFT P50 (ms)"),
    ("ttft_p95_ms", "TTFT P95 (ms)"),
    ("output_throughput_tps", "output throughput (tok/s)"),
)
INFO = (
    ("tpot_p50_ms", "TPOT P50 (ms)"),
    ("itl_p50_ms", "ITL P50 (ms)"),
    ("e2e_p50_ms", "E2E P50 (ms)"),
    ("request_throughput_rps", "requests/s"),
)


def pct(kv: float, ref: float) -> float | None:
    if kv is None or ref is None or ref == 0:
        return None
    return (kv - ref) / ref * 100


def compare(rounds: list[dict], tolerance_pct: float, subject: str = "kvbench", ref: str = "vllm") -> dict:
    """`subject` against `ref`, round by round: (subject - ref) / ref in percent."""
    keys = [k for k, _ in COMPARED + INFO]
    med = {tool: {k: statistics.median(r[tool][k] for r in rounds) for k in keys} for tool in (subject, ref)}
    paired = {k: [pct(r[subject][k], r[ref][k]) for r in rounds] for k in keys}
    paired_median = {
        k: statistics.median(v for v in paired[k] if v is not None) if any(v is not None for v in paired[k]) else None
        for k in keys
    }
    of_medians = {k: pct(med[subject][k], med[ref][k]) for k in keys}
    within = {k: paired_median[k] is not None and abs(paired_median[k]) <= tolerance_pct for k, _ in COMPARED}
    return {
        "subject": subject,
        "reference": ref,
        "median": med,
        "paired_diff_pct": paired,  # per round
        "diff_pct": paired_median,  # the verdict: median of the paired differences
        "diff_of_medians_pct": of_medians,
        "within_tolerance": within,
        "all_within": all(within.values()),
    }


def table(cmp: dict) -> str:
    subj, refname = cmp["subject"], cmp["reference"]
    lines = [f"{'metric':28} {subj:>16} {refname:>16} {'paired diff %':>14} {'diff of medians %':>18}"]
    for key, label in COMPARED + INFO:
        kv, ref = cmp["median"][subj][key], cmp["median"][refname][key]
        d, dm = cmp["diff_pct"][key], cmp["diff_of_medians_pct"][key]
        mark = "" if key not in cmp["within_tolerance"] else ("  ok" if cmp["within_tolerance"][key] else "  OFF")
        lines.append(f"{label:28} {kv:16.2f} {ref:16.2f} {_f(d):>14} {_f(dm):>18}{mark}")
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1f}"
