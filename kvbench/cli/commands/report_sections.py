"""`kvbench report`'s sections around the tables: the run header, emulation, overheads, workload capacity,
prefix cache, non-KV memory, comparisons, the client's scheduling and the problems (agreement with auto is a
table: report_tables.py). The rows are read out of the record by kvbench.records.reportrows; this module
formats them."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from kvbench.analysis.verdict import shown_in_lines
from kvbench.core.output import console, num
from kvbench.records import reportrows as rows
from kvbench.records import workload_label

# the comparisons a report shows, of every metric the record compares with auto
SHOWN_METRICS = ("ttft_p95_ms", "tpot_p95_ms", "output_throughput_tps", "request_throughput_rps", "e2e_p95_ms")
# whether an endpoint's server states the KV dtype it was said to run
CONFIRMED = {
    True: "confirmed by the server",
    False: "CONTRADICTED by the server",
    None: "not stated by the server (unchecked)",
}


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


def render_header(doc: dict, path: Path | None) -> None:
    """The run, its model, engine and workload; each endpoint a dtype was measured on; the SLO."""
    cfg = doc.get("config", {})
    env = doc.get("environment", {})
    vllm = env.get("vllm") or {}
    w = cfg.get("workload") or {}
    console.print(
        f"[bold]run {doc.get('run_id')}[/] on {doc.get('machine')} — status [bold]{doc.get('status')}[/]"
        + (f"  ({path})" if path else "")
    )
    served = rows.served_versions(doc)
    engine = (
        f"vLLM {', '.join(served) or 'version unknown'} (endpoint)"
        if cfg.get("endpoint")
        else f"{vllm.get('package') or 'vLLM'} {vllm.get('version') or 'version unknown'}"
    )
    if not cfg:  # 3a: never "model None ... None prompt + None output tokens"
        console.print(f"{engine}; model, workload and max_model_len unknown: this record keeps no config")
    else:
        console.print(
            f"model {cfg.get('model_name') or 'unknown'}, {engine}; "
            + (
                f"workload {workload_label(cfg)}; "
                if cfg.get("workload_spec")
                else f"{w.get('prompt_tokens', '?')} prompt + {w.get('output_tokens', '?')} output tokens per request; "
            )
            + f"max_model_len {cfg.get('max_model_len') or 'unknown'}"
        )
    for d, server in rows.endpoint_rows(doc):
        confirmed = CONFIRMED[d.get("kv_dtype_confirmed")]
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


def render_overheads(doc: dict) -> None:
    overheads = rows.overheads(doc)
    if overheads:
        console.print(
            "kept back by vLLM besides weights and KV (activations, CUDA graphs), per GPU: "
            + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in overheads.items())
            + " — pass it to `kvbench capacity/plan --overhead-gb`"
        )


def render_client(doc: dict) -> None:
    """How the load generator itself was scheduled: a client starved of CPU skews every latency."""
    schedule = rows.client_schedule(doc)
    if schedule is not None:
        policies, wait = schedule
        console.print(
            f"client: scheduled {', '.join(policies)}; waited for a CPU at most "
            + (f"{wait:.1%}" if wait is not None else "— (unknown)")
            + " of a fixed phase"
        )


def render_problems(doc: dict, decision) -> None:
    """Failed dtypes with their log tail, warnings, and findings not already in a dtype's verdict line."""
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


def render_workload_capacity(doc: dict) -> None:
    """Requests that fit at the workload's own sequence lengths, against the max_model_len worst case."""
    found = rows.workload_capacity_rows(doc)
    if not found:
        return
    table = Table(
        title="Requests that fit at the workload's own lengths (prompt + output tokens; whole KV blocks)",
        title_justify="left",
    )
    for col in ("KV dtype", "pool", "max_model_len", "P99", "P90", "mean"):
        table.add_column(col, justify="left" if col == "KV dtype" else "right")
    for dtype, dist in found:

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
    found = rows.prefix_cache_rows(doc)
    if not found:
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
    for dtype, p in found:
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
    for dtype, nk in rows.non_kv_rows(doc):
        if nk.get("error"):
            console.print(f"{dtype}: no non-KV prediction: {nk['error']}")
            continue
        stage, log = nk["predicted"]["stages"][0], nk.get("measured_from_log") or {}
        console.print(
            f"{dtype} memory per GPU, predicted / vLLM's log (GiB): "
            + ", ".join(f"{t} {num(stage[t]['gib'], 2)} / {num(log.get(k), 2)}" for t, k in rows.NON_KV_PAIRS)
        )


def render_comparisons(doc: dict) -> None:
    """Each dtype vs auto over the repeats: the paired difference with its 95% CI and whether it is beyond noise."""
    found = rows.comparison_rows(doc)
    if not found:
        return
    table = Table(title="vs auto, paired by repeat (same prompts): difference and 95% CI", title_justify="left")
    for col in ("KV dtype", "metric", "difference", "95% CI", "relative", "beyond noise?"):
        table.add_column(col, justify="left" if col in ("KV dtype", "metric") else "right")
    for dtype, metric, v, emulated in found:
        if metric not in SHOWN_METRICS:
            continue
        table.add_row(
            dtype,
            metric,
            num(v["mean"], 2),
            f"{num(v['ci_low'], 2)} .. {num(v['ci_high'], 2)}",
            f"{v['relative_pct']:+.1f}%" if v.get("relative_pct") is not None else "—",
            "emulated: not compared" if emulated else ("yes" if v.get("beyond_noise") else "no (within noise)"),
        )
    console.print(table)
