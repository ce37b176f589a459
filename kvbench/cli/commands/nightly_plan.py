"""`kvbench nightly --dry-run`'s plan as printed: each machine's table of entries with minutes, GPU-hours and
cost, and the same plan as JSON. The estimate's assumptions are kvbench.orchestration.nightly.estimate's, the GPU answer
per entry kvbench.orchestration.nightly.sizing's."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from kvbench.core.output import console


def machine_folder(plan) -> str:
    from kvbench.orchestration.nightly.matrix import machine_folder as folder

    return folder(plan)


def _slo_text(slo: dict | None) -> str:
    if slo is None:
        return "none: no search"
    ttft, tpot = slo.get("ttft_p95_ms"), slo.get("tpot_p95_ms")
    return f"{'—' if ttft is None else f'{ttft:g}'} / {'—' if tpot is None else f'{tpot:g}'}"


def render_plan(cfg, plan, est, detected: bool) -> None:
    from kvbench.orchestration.nightly import vllm
    from kvbench.orchestration.nightly.estimate import history_entry
    from kvbench.orchestration.nightly.sizing import plan_lines

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


def _plan_json(cfg, plan, est) -> dict:
    from kvbench.orchestration.nightly import vllm
    from kvbench.orchestration.nightly.estimate import history_entry
    from kvbench.orchestration.nightly.sizing import plan_rows

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
