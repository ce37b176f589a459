"""`kvbench report RUN.json`: the tables of a run record (capacity three ways, latency, throughput)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvbench.harness.records import fixed_phase, headline, load_record
from kvbench.output import console, num, print_json

NAME = "report"
HELP = "Print the tables of a run record: capacity (engine / SLO-measured / model), TTFT, TPOT, throughput."


def _conc(value) -> str:
    return "—" if value is None else f"{value:,.2f}"


def render(doc: dict, path: Path | None = None) -> None:
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
    engine = (f"vLLM {', '.join(served) or 'version unknown'} (endpoint)" if cfg.get("endpoint")
              else f"{vllm.get('package')} {vllm.get('version')}")
    console.print(
        f"model {cfg.get('model_name')}, {engine}; "
        f"{w.get('prompt_tokens')} prompt + {w.get('output_tokens')} output tokens per request; "
        f"max_model_len {cfg.get('max_model_len')}"
    )
    for d in doc.get("dtypes", []):
        server = d.get("server") or {}
        if server and not server.get("managed", True):
            confirmed = {True: "confirmed by the server", False: "CONTRADICTED by the server",
                         None: "not stated by the server (unchecked)"}[d.get("kv_dtype_confirmed")]
            console.print(f"{d['kv_cache_dtype']}: endpoint {server.get('base_url')} serving {server.get('served_model')} "
                          f"({server.get('model_root')}), vLLM {server.get('vllm_version') or 'unknown'}; KV dtype {confirmed}")
    slo = cfg.get("slo")
    if slo:
        console.print(f"SLO for measured capacity: TTFT P95 <= {slo.get('ttft_p95_ms')} ms, TPOT P95 <= {slo.get('tpot_p95_ms')} ms")

    cap = Table(title="Max concurrent requests of max_model_len tokens, three ways", title_justify="left")
    for col in ("KV dtype", "status", "engine reports", "measured under SLO", "capacity model", "engine KV tokens", "model KV tokens"):
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
        measured = ((d.get("capacity") or {}).get("measured") or {})
        m = h["measured_max_concurrency"]
        m_text = "—" if m is None else f"{m}{'+' if measured.get('capped') else ''}"
        cap.add_row(
            d["kv_cache_dtype"],
            d.get("status", "?"),
            _conc(h["engine_max_concurrency"]),
            m_text,
            _conc(h["model_max_concurrency"]),
            f"{h['engine_kv_tokens']:,}" if h["engine_kv_tokens"] else "—",
            f"{h['model_kv_tokens']:,}" if h["model_kv_tokens"] else "—",
        )
        fixed = fixed_phase(d)
        mode = (fixed or {}).get("mode") or {}
        load = f"concurrency {mode['concurrency']}" if "concurrency" in mode else (f"{mode.get('rate_rps')} req/s" if mode else "—")
        lat.add_row(
            d["kv_cache_dtype"],
            load,
            num(h["ttft_p50_ms"], 1),
            num(h["ttft_p95_ms"], 1),
            num(h["tpot_p95_ms"], 2),
            num(h["e2e_p95_ms"], 0),
            num(h["output_throughput_tps"], 0),
            num(h["request_throughput_rps"], 2),
            num(h["goodput_rps"], 2),
            f"{h['completed'] or 0} / {h['failed'] or 0}" if fixed else "—",
        )
    console.print(cap)
    overheads = {d["kv_cache_dtype"]: ((d.get("capacity") or {}).get("model") or {}).get("activation_overhead_bytes") for d in doc.get("dtypes", [])}
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
    agree = [(d["kv_cache_dtype"], (d.get("agreement") or {}).get("vs_auto")) for d in doc.get("dtypes", [])]
    agree = [(dtype, a) for dtype, a in agree if a]
    if agree:
        first = next(d.get("agreement") for d in doc["dtypes"] if (d.get("agreement") or {}).get("vs_auto"))
        acc = Table(
            title=(f"End-to-end accuracy vs auto: {first['vs_auto']['sequences']} prompts of {first.get('prompt_tokens', '?')} tokens, "
                   f"{first.get('tokens', '?')} greedy tokens each"),
            title_justify="left",
        )
        for col in ("KV dtype", "same greedy token", "identical outputs", "first difference at token", "|Δ logprob| mean (teacher-forced)", "|Δ logprob| max"):
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
            tail = [line for line in d.get("log_tail") or [] if '" 200 OK' not in line and "HTTP/1.1\"" not in line]
            for line in tail[-5:]:
                console.print("    " + line, markup=False, highlight=False)  # log text is not rich markup
        for warning in d.get("warnings", []):
            console.print(f"[yellow]{d['kv_cache_dtype']}: {warning}[/]")
    for finding in doc.get("findings", []):
        console.print(f"[bold yellow]!! {finding['text']}[/]")


def command(
    record: Annotated[Path, typer.Argument(help="A run record JSON written by `kvbench run`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the per-dtype headline numbers as JSON.")] = False,
) -> None:
    doc = load_record(record)
    if as_json:
        print_json({"run_id": doc["run_id"], "status": doc["status"], "dtypes": {d["kv_cache_dtype"]: headline(d) for d in doc["dtypes"]}, "findings": doc.get("findings", [])})
        return
    render(doc, record)
