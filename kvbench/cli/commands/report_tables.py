"""`kvbench report`'s two main tables: capacity three ways (engine, measured under the SLO, model) and the
fixed-load phase's latency and throughput, one row per dtype; and the free-running agreement with auto."""

from __future__ import annotations

from rich.table import Table

from kvbench.core.output import console, num
from kvbench.records import fixed_phase, headline
from kvbench.records.reportrows import agreement_rows


def _conc(value) -> str:
    return "—" if value is None else f"{value:,.2f}"


def _name(d: dict) -> str:
    """A dtype's row label: "nvfp4 (emulated)" where an emulation served it."""
    return f"{d['kv_cache_dtype']} (emulated)" if d.get("emulated") else d["kv_cache_dtype"]


def _speed(d: dict, text: str) -> str:
    """A speed cell: dimmed where the dtype was emulated (kept, never compared)."""
    return f"[dim]{text}[/]" if d.get("emulated") and text != "—" else text


def capacity_table(doc: dict) -> Table:
    probes = {
        d["kv_cache_dtype"]: len(((d.get("capacity") or {}).get("measured") or {}).get("probes") or [])
        for d in doc.get("dtypes", [])
    }
    probes = {k: v for k, v in probes.items() if v}
    cap = Table(
        title="Max concurrent requests of max_model_len tokens, three ways"
        + (f" (SLO search: {', '.join(f'{k} {v}' for k, v in probes.items())} probes)" if probes else ""),
        title_justify="left",
    )
    for col in (
        "KV dtype",
        "status",
        "engine reports",
        "measured under SLO",
        "capacity model",
        "engine KV tokens",
        "model KV tokens",
    ):
        cap.add_column(col, justify="left" if col in ("KV dtype", "status") else "right")
    return cap


def latency_table() -> Table:
    lat = Table(title="Fixed-load phase", title_justify="left")
    for col in (
        "KV dtype",
        "load",
        "TTFT P50 (ms)",
        "TTFT P95 (ms)",
        "TPOT P95 (ms)",
        "E2E P95 (ms)",
        "output (tok/s)",
        "requests (req/s)",
        "goodput (req/s)",
        "ok / failed",
    ):
        lat.add_column(col, justify="left" if col in ("KV dtype", "load") else "right")
    return lat


def add_rows(cap: Table, lat: Table, d: dict) -> None:
    """One dtype's row in the capacity table and in the fixed-load table."""
    h = headline(d)
    measured = (d.get("capacity") or {}).get("measured") or {}
    m = h["measured_max_concurrency"]
    m_text = "—" if m is None else f"{m}{'+' if measured.get('capped') else ''}"
    cap.add_row(
        _name(d),
        d.get("status", "?"),
        _conc(h["engine_max_concurrency"]),
        _speed(d, m_text),
        _conc(h["model_max_concurrency"]),
        f"{h['engine_kv_tokens']:,}" if h["engine_kv_tokens"] else "—",
        f"{h['model_kv_tokens']:,}" if h["model_kv_tokens"] else "—",
    )
    fixed = fixed_phase(d)
    mode = (fixed or {}).get("mode") or {}
    load = _load_text(mode)
    reps = d.get("fixed_stats") or {}

    def cell(key: str, digits: int) -> str:
        st = reps.get(key)
        if st and st.get("ci_low") is not None:
            return _speed(d, f"{num(st['mean'], digits)} ±{num((st['ci_high'] - st['ci_low']) / 2, digits)}")
        return _speed(d, num(h[key], digits))

    n = max((st["n"] for st in reps.values()), default=1)
    lat.add_row(
        _name(d),
        load + (f" x{n}" if n > 1 else ""),
        cell("ttft_p50_ms", 1),
        cell("ttft_p95_ms", 1),
        cell("tpot_p95_ms", 2),
        cell("e2e_p95_ms", 0),
        cell("output_throughput_tps", 0),
        cell("request_throughput_rps", 2),
        cell("goodput_rps", 2),
        f"{h['completed'] or 0} / {h['failed'] or 0}" if fixed else "—",
    )


def _load_text(mode: dict) -> str:
    kind = mode.get("kind")
    if kind == "timed":
        return f"trace: {mode.get('requests')} requests over {num(mode.get('duration_s'), 1)} s"
    if kind == "sessions":
        return f"{mode.get('sessions')} conversations ({mode.get('turns')} turns), {mode.get('max_concurrent')} at once"
    if "concurrency" in mode:
        return f"concurrency {mode['concurrency']}"
    return f"{mode.get('rate_rps')} req/s" if mode else "—"


def render_agreement(doc: dict) -> None:
    """Greedy-token agreement and logprob deltas of each dtype against auto."""
    agree = agreement_rows(doc)
    if not agree:
        return
    first = next(d.get("agreement") for d in doc["dtypes"] if (d.get("agreement") or {}).get("vs_auto"))
    acc = Table(
        title=(
            f"Free-running greedy outputs vs auto: {first['vs_auto']['sequences']} random-token prompts of "
            f"{first.get('prompt_tokens', '?')} tokens, "
            f"{first.get('tokens', '?')} greedy tokens each"
        ),
        title_justify="left",
    )
    for col in (
        "KV dtype",
        "same token at the position",
        "identical outputs",
        "first difference at token",
        "|Δ logprob| mean (teacher-forced)",
        "|Δ logprob| max",
    ):
        acc.add_column(col, justify="left" if col == "KV dtype" else "right")
    for dtype, a in agree:
        acc.add_row(
            dtype,
            f"{a['token_agreement']:.1%}" if a.get("token_agreement") is not None else "—",
            f"{a['identical_sequences']} / {a['sequences']}",
            num(a.get("mean_first_difference"), 1),
            num(a.get("logprob_delta_mean"), 4),
            num(a.get("logprob_delta_max"), 4),
        )
    console.print(acc)
    console.print(
        "Free-running: once one token differs, the two outputs go on from different text, so every later position "
        "counts as a difference; on random-token prompts the model's next token is often a near-tie. The per-token "
        "rate is fidelity's top-1 agreement (teacher-forced: auto's prefix at every position), above."
    )
