"""`kvbench report RUN.json`: the tables of a run record (capacity three ways, latency, throughput)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kvbench.harness.records import RunRecord, conditions, fixed_phase, headline, load_record, workload_label
from kvbench.output import console, num, print_json, terminal_safe
from kvbench.verdict import decide, shown_in_lines
from kvbench.verdict_speed import cost_lines

NAME = "report"
HELP = "Print the tables of a run record: capacity (engine / SLO-measured / model), TTFT, TPOT, throughput."


def _conc(value) -> str:
    return "—" if value is None else f"{value:,.2f}"


def _name(d: dict) -> str:
    """A dtype's row label: "nvfp4 (emulated)" where an emulation served it."""
    return f"{d['kv_cache_dtype']} (emulated)" if d.get("emulated") else d["kv_cache_dtype"]


def _speed(d: dict, text: str) -> str:
    """A speed cell: dimmed where the dtype was emulated (kept, never compared)."""
    return f"[dim]{text}[/]" if d.get("emulated") and text != "—" else text


def render_emulated(doc: dict) -> None:
    for d in doc.get("dtypes", []):
        impl = d.get("implementation") or {}
        if d.get("emulated"):
            console.print(
                f"[yellow]{d['kv_cache_dtype']} emulated[/] by {impl.get('name')} v{impl.get('version')}: it stores "
                f"{impl.get('stores')}; attention: {impl.get('computes')}. Capacity, admission, preemptions, "
                "prefix-cache hits and accuracy count; its speed numbers (dimmed) are "
                + str(impl.get("not_representative") or "not representative").removeprefix("emulated: ")
                + ", and are never compared, tracked or used to recommend."
            )


def render(doc: dict, path: Path | None = None) -> None:
    # A record quotes servers and logs: their text is printed, never interpreted. The verdict is derived from the
    # text as measured (control characters removed) and escaped where it is printed; the rest prints `doc`.
    record = RunRecord.model_validate(terminal_safe(doc, markup=False))
    doc = terminal_safe(doc)
    cfg = doc.get("config", {})
    env = doc.get("environment", {})
    vllm = env.get("vllm") or {}
    w = cfg.get("workload") or {}
    console.print(
        f"[bold]run {doc.get('run_id')}[/] on {doc.get('machine')} — status [bold]{doc.get('status')}[/]"
        + (f"  ({path})" if path else "")
    )
    served = {(d.get("server") or {}).get("vllm_version") for d in doc.get("dtypes", []) if d.get("server")}
    served = sorted(v for v in served if v)
    engine = (
        f"vLLM {', '.join(served) or 'version unknown'} (endpoint)"
        if cfg.get("endpoint")
        else f"{vllm.get('package')} {vllm.get('version')}"
    )
    console.print(
        f"model {cfg.get('model_name')}, {engine}; "
        + (
            f"workload {workload_label(cfg)}; "
            if cfg.get("workload_spec")
            else f"{w.get('prompt_tokens')} prompt + {w.get('output_tokens')} output tokens per request; "
        )
        + f"max_model_len {cfg.get('max_model_len')}"
    )
    for d in doc.get("dtypes", []):
        server = d.get("server") or {}
        if server and not server.get("managed", True):
            confirmed = {
                True: "confirmed by the server",
                False: "CONTRADICTED by the server",
                None: "not stated by the server (unchecked)",
            }[d.get("kv_dtype_confirmed")]
            console.print(
                f"{d['kv_cache_dtype']}: endpoint {server.get('base_url')} serving {server.get('served_model')} "
                f"({server.get('model_root')}), vLLM {server.get('vllm_version') or 'unknown'}; KV dtype {confirmed}"
            )
    slo = cfg.get("slo")
    if slo:
        console.print(
            f"SLO for measured capacity: TTFT P95 <= {slo.get('ttft_p95_ms')} ms, "
            f"TPOT P95 <= {slo.get('tpot_p95_ms')} ms"
        )

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
    for d in doc.get("dtypes", []):
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

        def cell(key: str, digits: int, reps=reps, h=h, d=d) -> str:
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
    console.print(cap)
    overheads = {
        d["kv_cache_dtype"]: ((d.get("capacity") or {}).get("model") or {}).get("activation_overhead_bytes")
        for d in doc.get("dtypes", [])
    }
    overheads = {k: v for k, v in overheads.items() if v is not None}
    if overheads:
        console.print(
            "kept back by vLLM besides weights and KV (activations, CUDA graphs), per GPU: "
            + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in overheads.items())
            + " — pass it to `kvbench capacity/plan --overhead-gb`"
        )
    console.print(
        "engine: vLLM's startup report (log or /metrics); measured: highest concurrency meeting the SLO "
        "('+': the search cap was reached); model: kvbench's page-accurate prediction for the engine's KV budget."
    )
    console.print(lat)
    render_emulated(doc)
    if any(d.get("fixed_stats") for d in doc.get("dtypes", [])):
        console.print("xN: the fixed load ran N times with fresh prompts; mean ±half-width of its 95% t interval.")
    render_workload_capacity(doc)
    render_prefix_cache(doc)
    render_non_kv(doc)
    render_comparisons(doc)
    decision = decide(record)
    render_fronts(doc, record)
    render_quality(doc, decision)
    agree = [(d["kv_cache_dtype"], (d.get("agreement") or {}).get("vs_auto")) for d in doc.get("dtypes", [])]
    agree = [(dtype, a) for dtype, a in agree if a]
    if agree:
        first = next(d.get("agreement") for d in doc["dtypes"] if (d.get("agreement") or {}).get("vs_auto"))
        acc = Table(
            title=(
                f"End-to-end accuracy vs auto: {first['vs_auto']['sequences']} prompts of "
                f"{first.get('prompt_tokens', '?')} tokens, "
                f"{first.get('tokens', '?')} greedy tokens each"
            ),
            title_justify="left",
        )
        for col in (
            "KV dtype",
            "same greedy token",
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
    fixed_phases = [p for p in (fixed_phase(d) for d in doc.get("dtypes", [])) if p]
    policies = sorted({(p.get("summary") or {}).get("client_policy") or "unknown" for p in fixed_phases})
    waits = [(p.get("summary") or {}).get("client_runqueue_wait_fraction") for p in fixed_phases]
    waits = [w for w in waits if w is not None]
    if fixed_phases:
        console.print(
            f"client: scheduled {', '.join(policies)}; waited for a CPU at most "
            + (f"{max(waits):.1%}" if waits else "— (unknown)")
            + " of a fixed phase"
        )
    for d in doc.get("dtypes", []):
        if d.get("status") != "ok":
            console.print(f"[red]{d['kv_cache_dtype']}: {d.get('status')}[/] — {d.get('error')}")
            # uvicorn's access lines ("POST /v1/completions ... 500") say nothing the error does not
            tail = [line for line in d.get("log_tail") or [] if '" 200 OK' not in line and 'HTTP/1.1"' not in line]
            for line in tail[-5:]:
                console.print("    " + line, markup=False, highlight=False)  # log text is not rich markup
        for warning in d.get("warnings", []):
            console.print(f"[yellow]{d['kv_cache_dtype']}: {warning}[/]")
    for finding in doc.get("findings", []):
        if not shown_in_lines(finding, decision):  # a dtype's reasons are printed once, in its line
            console.print(f"[bold yellow]!! {finding['text']}[/]")  # escaped by terminal_safe


def _load_text(mode: dict) -> str:
    kind = mode.get("kind")
    if kind == "timed":
        return f"trace: {mode.get('requests')} requests over {num(mode.get('duration_s'), 1)} s"
    if kind == "sessions":
        return f"{mode.get('sessions')} conversations ({mode.get('turns')} turns), {mode.get('max_concurrent')} at once"
    if "concurrency" in mode:
        return f"concurrency {mode['concurrency']}"
    return f"{mode.get('rate_rps')} req/s" if mode else "—"


def render_workload_capacity(doc: dict) -> None:
    """Requests that fit at the workload's own sequence lengths, against the max_model_len worst case."""
    rows = [(d["kv_cache_dtype"], (d.get("capacity") or {}).get("distribution")) for d in doc.get("dtypes", [])]
    rows = [(k, v) for k, v in rows if v]
    if not rows:
        return
    table = Table(
        title="Requests that fit at the workload's own lengths (prompt + output tokens; whole KV blocks)",
        title_justify="left",
    )
    for col in ("KV dtype", "pool", "max_model_len", "P99", "P90", "mean"):
        table.add_column(col, justify="left" if col == "KV dtype" else "right")
    for dtype, dist in rows:

        def cell(key, dist=dist):
            c = dist.get(key) or {}
            ratio = c.get("vs_max_model_len")
            return f"{c.get('max_concurrency')} @ {c.get('tokens')} tok" + (
                f" ({ratio:.1f}x)" if ratio and key != "max_model_len" else ""
            )

        table.add_row(
            dtype,
            f"{dist.get('pool_tokens'):,} tok ({dist.get('source')})",
            *(cell(k) for k in ("max_model_len", "p99", "p90", "mean")),
        )
    console.print(table)


def render_prefix_cache(doc: dict) -> None:
    """vLLM's prefix-cache hit rate over each fixed phase and the TTFT of requests that hit it or missed."""
    rows = [
        (d["kv_cache_dtype"], p) for d in doc.get("dtypes", []) for p in d.get("phases") or [] if p.get("prefix_cache")
    ]
    if not rows or all((p["prefix_cache"].get("queries_tokens") or 0) == 0 for _, p in rows):
        return
    table = Table(
        title="Prefix cache over the fixed load (vLLM /metrics; TTFT split by usage cached_tokens)",
        title_justify="left",
    )
    for col in (
        "KV dtype",
        "phase",
        "hit rate (tokens)",
        "preemptions",
        "requests hit / reporting",
        "TTFT P50 hit (ms)",
        "TTFT P50 miss (ms)",
    ):
        table.add_column(col, justify="left" if col in ("KV dtype", "phase") else "right")
    for dtype, p in rows:
        pc = p["prefix_cache"]
        rate = pc.get("hit_rate")
        table.add_row(
            dtype,
            p["name"],
            "—" if rate is None else f"{rate:.1%}",
            num(pc.get("preemptions"), 0),
            f"{pc.get('requests_with_cached_tokens')} / {pc.get('requests_reporting')}",
            num((pc.get("ttft_hit_ms") or {}).get("p50"), 1),
            num((pc.get("ttft_miss_ms") or {}).get("p50"), 1),
        )
    console.print(table)


def render_non_kv(doc: dict) -> None:
    """On a GPU: kvbench's predicted non-KV terms against the server log's (first rank), GiB."""
    for d in doc.get("dtypes", []):
        nk = (d.get("capacity") or {}).get("non_kv")
        if not nk:
            continue
        if nk.get("error"):
            console.print(f"{d['kv_cache_dtype']}: no non-KV prediction: {nk['error']}")
            continue
        stage, log = nk["predicted"]["stages"][0], nk.get("measured_from_log") or {}
        pairs = [
            ("weights", "weights_gib"),
            ("activation", "activation_gib"),
            ("non_torch", "non_torch_gib"),
            ("cudagraph", "cudagraph_gib"),
            ("kv_pool", "kv_pool_gib"),
        ]
        console.print(
            f"{d['kv_cache_dtype']} memory per GPU, predicted / vLLM's log (GiB): "
            + ", ".join(f"{t} {num(stage[t]['gib'], 2)} / {num(log.get(k), 2)}" for t, k in pairs)
        )


def render_comparisons(doc: dict) -> None:
    """Each dtype vs auto over the repeats: the paired difference with its 95% CI and whether it is beyond noise."""
    rows = [
        (c["kv_cache_dtype"], m, v) for c in doc.get("comparisons") or [] for m, v in (c.get("metrics") or {}).items()
    ]
    if not rows:
        return
    table = Table(title="vs auto, paired by repeat (same prompts): difference and 95% CI", title_justify="left")
    for col in ("KV dtype", "metric", "difference", "95% CI", "relative", "beyond noise?"):
        table.add_column(col, justify="left" if col in ("KV dtype", "metric") else "right")
    emulated = {d["kv_cache_dtype"] for d in doc.get("dtypes", []) if d.get("emulated")}
    for dtype, metric, v in rows:
        if metric not in (
            "ttft_p95_ms",
            "tpot_p95_ms",
            "output_throughput_tps",
            "request_throughput_rps",
            "e2e_p95_ms",
        ):
            continue
        table.add_row(
            dtype,
            metric,
            num(v["mean"], 2),
            f"{num(v['ci_low'], 2)} .. {num(v['ci_high'], 2)}",
            f"{v['relative_pct']:+.1f}%" if v.get("relative_pct") is not None else "—",
            "emulated: not compared"
            if dtype in emulated
            else ("yes" if v.get("beyond_noise") else "no (within noise)"),
        )
    console.print(table)


def render_quality(doc: dict, decision) -> None:
    """Task accuracy per dtype and condition (Wilson 95% CI) with its verdict against auto, then the
    recommendation: one line per dtype, each reason once (kvbench.verdict, the one place it is decided)."""
    rows = [
        (d["kv_cache_dtype"], cond, summary, task, e)
        for d in doc.get("dtypes", [])
        for cond, summary in conditions(d.get("eval"))
        for task, e in (summary.get("tasks") or {}).items()
    ]
    if rows:
        table = Table(
            title="Task accuracy through lm-evaluation-harness (temperature 0; Wilson 95% CI; vs auto on the same "
            "items: non-inferiority against the budget)",
            title_justify="left",
        )
        for col in ("KV dtype", "task", "condition", "accuracy", "95% CI", "items", "vs auto", "vs itself at rest"):
            table.add_column(col, justify="right" if col in ("accuracy", "95% CI", "items") else "left")
        for dtype, cond, summary, task, e in rows:
            ci = e.get("ci95")
            acc = decision.dtypes[dtype].accuracy if dtype in decision.dtypes else None
            table.add_row(
                dtype,
                task,
                _condition(cond, summary),
                f"{e['accuracy'] * 100:.1f}%" if e.get("accuracy") is not None else "—",
                f"{ci[0] * 100:.1f}..{ci[1] * 100:.1f}%" if ci else "—",
                str(e.get("n")),
                _test_cell(acc.tests if acc else (), task, cond),
                _test_cell(acc.under_load if acc else (), task, cond),
            )
        console.print(table, markup=False)
    for d in doc.get("dtypes", []):
        if (d.get("eval") or {}).get("error"):
            console.print(f"[red]{d['kv_cache_dtype']}: evaluation failed[/] — {d['eval']['error']}")
    canaries = [
        (
            d["kv_cache_dtype"],
            sum((p.get("canaries") or {}).get("sent", 0) for p in d.get("phases", [])),
            sum((p.get("canaries") or {}).get("differ", 0) for p in d.get("phases", [])),
        )
        for d in doc.get("dtypes", [])
    ]
    canaries = [c for c in canaries if c[1]]
    if canaries:
        console.print(
            "canaries (at-rest greedy outputs re-sent inside every load phase): "
            + ", ".join(f"{k} {differ} of {sent} differed" for k, sent, differ in canaries)
        )
    render_decision(decision)


def render_decision(decision) -> None:
    """The recommendation, then one line per dtype."""
    p = decision.policy
    console.print(
        f"[bold]{escape(decision.headline())}[/]"
        if decision.recommended
        else f"[bold red]{escape(decision.headline())}[/]"
    )
    for line in decision.lines():
        console.print("  " + line, markup=False, highlight=False)
    console.print(
        f"how: accuracy must be non-inferior to auto within {p.budget:g} point{'' if p.budget == 1 else 's'}"
        + (f" ({', '.join(f'{k} {v:g}' for k, v in p.budgets.items())})" if p.budgets else "")
        + f" at one-sided {p.confidence:.0%} confidence; {decision.method}",
        markup=False,
        highlight=False,
    )


def _condition(cond: str, summary: dict) -> str:
    c = summary.get("concurrency")
    return {
        "rest": "at rest (1 at a time)",
        "load": f"at load ({c} in flight)",
        "during_load": "during load (1 at a time beside the fixed load)",
    }.get(cond, cond)


def _test_cell(tests, task: str, cond: str) -> str:
    """The verdict on one condition: its drop, the one-sided bound and the test's verdict."""
    for t in tests:
        if t.task == task and cond in t.conditions:
            r = t.result
            bound = -r.upper if r.verdict == "inferior" else -r.lower
            return f"{r.verdict}: drop {t.drop + 0.0:+.1f}, bound {bound * 100:.1f} vs budget {t.budget:g}"
    return "—"


def render_fronts(doc: dict, record) -> None:
    """The trade-off curve per dtype (points, the Pareto front, cost) and what it says against auto."""
    fronts = [(d["kv_cache_dtype"], d["front"]) for d in doc.get("dtypes", []) if d.get("front")]
    if not fronts:
        return
    emulated = {d["kv_cache_dtype"] for d in doc.get("dtypes", []) if d.get("emulated")}
    priced = any(f.get("price_per_gpu_hour") is not None for _, f in fronts)
    gpus = fronts[0][1].get("gpus", 1)
    per = "GPU" if (doc.get("environment") or {}).get("gpus") else "device"
    table = Table(
        title=f"Throughput vs interactivity (* on the Pareto front; per {per}, {gpus} per server)", title_justify="left"
    )
    cols = [
        "KV dtype",
        "concurrency",
        f"output tok/s per {per}",
        "tok/s per user (1000/TPOT P50)",
        "tok/s per user (E2E)",
        "TTFT P95 (ms)",
        "TPOT P95 (ms)",
        "SLO",
    ] + (["USD / M output tok"] if priced else [])
    for col in cols:
        table.add_column(col, justify="left" if col == "KV dtype" else "right")
    for dtype, f in fronts:
        for p in f.get("points") or []:
            met = {True: "met", False: "missed", None: "—"}[p.get("meets_slo")]
            row = [
                dtype,
                f"{p['concurrency']}{'*' if p.get('on_front') and dtype not in emulated else ''}",
                num(p.get("output_tps_per_gpu"), 0),
                num(p.get("user_tps"), 1),
                num(p.get("user_tps_e2e"), 1),
                num(p.get("ttft_p95_ms"), 1),
                num(p.get("tpot_p95_ms"), 2),
                met,
            ]
            if priced:
                row.append(num(p.get("usd_per_m_output"), 3))
            if dtype in emulated:  # the emulation's speed: kept, never a front to choose from
                row = [f"[dim]{x}[/]" for x in [f"{dtype} (emulated)", *row[1:]]]
            table.add_row(*row)
    console.print(table)
    for dtype, f in fronts:
        best, target = f.get("at_slo"), f.get("at_target")
        parts = []
        if best:
            cost = (
                f", USD {best['usd_per_m_output']:.3f} per million output tokens"
                if best.get("usd_per_m_output") is not None
                else ""
            )
            parts.append(
                f"under the SLO best at concurrency {best['concurrency']}: "
                f"{best['output_tps_per_gpu']:,.0f} tok/s per {per}{cost}"
            )
        if target:
            cost = f", USD {target['usd_per_m_output']:.3f}/M" if target.get("usd_per_m_output") is not None else ""
            parts.append(
                f"at {target['user_tps']:.1f} tok/s per user (front, PCHIP): "
                f"{target['output_tps_per_gpu']:,.0f} tok/s per {per}{cost}"
            )
        elif f.get("target_user_tps"):
            parts.append(f"its front does not reach {f['target_user_tps']:.1f} tok/s per user")
        if parts:
            note = " (emulated: not representative)" if dtype in emulated else ""
            console.print(f"{dtype}{note}: " + "; ".join(parts))
    for c in doc.get("comparisons") or []:
        if c["kv_cache_dtype"] in emulated:
            console.print(f"{c['kv_cache_dtype']}: no cost or throughput comparison with auto (its speed is emulated)")
    for line in cost_lines(record):  # each with the interval its throughput's uncertainty allows
        console.print(line, markup=False, highlight=False)
    energy = [(d["kv_cache_dtype"], (fixed_phase(d) or {}).get("energy")) for d in doc.get("dtypes", [])]
    energy = [(k, e) for k, e in energy if e]
    if energy and all(not e.get("valid") for _, e in energy):
        console.print(f"energy: not measured ({energy[0][1].get('reason')})")
    for dtype, e in energy:
        if e.get("valid"):
            console.print(
                f"energy {dtype} ({e['source']}): {e['avg_watts']:.0f} W average, "
                f"{num(e.get('j_per_output_token'), 3)} J per output token, "
                f"{num(e.get('j_per_total_token'), 4)} J per token"
            )


def command(
    record: Annotated[Path, typer.Argument(help="A run record JSON written by `kvbench run`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the per-dtype headline numbers as JSON.")] = False,
) -> None:
    doc = load_record(record)
    if as_json:
        print_json(
            {
                "run_id": doc["run_id"],
                "status": doc["status"],
                "dtypes": {d["kv_cache_dtype"]: headline(d) for d in doc["dtypes"]},
                "findings": doc.get("findings", []),
                "quality": decide(RunRecord.model_validate(doc)).as_dict(),
            }
        )
        return
    render(doc, record)
