"""`kvbench report`'s two main tables: capacity three ways (engine, measured under the SLO, model) and the
fixed-load phase's latency and throughput, one row per dtype."""

from __future__ import annotations

from rich.table import Table

from kvbench.output import num
from kvbench.records import fixed_phase, headline


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
