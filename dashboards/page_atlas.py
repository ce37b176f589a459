"""Atlas: every KV dtype vLLM offers, measured in one run (`kvbench run --kv-dtypes all`): one table sorted by
capacity (kvbench/analysis/verdict_atlas.py, the rows `kvbench report` prints) and the trade-off a user picks from,
capacity gain over auto against mean KLD at rest. Newest atlas run per machine and model."""

from __future__ import annotations

import plotly.graph_objects as go

from kvbench.dashboards.components import Page, empty, note, section, slug
from kvbench.dashboards.data import SiteData
from kvbench.dashboards.theme import color, esc, style, symbol

SLUG, TITLE = "atlas", "Atlas"
COLUMNS = ("dtype", "served", "KV tokens", "vs auto", "model = engine", "verdict", "mean KLD at rest [95% CI]",
           "top-1 agree", "scales", "why")  # fmt: skip


def atlas_records(data: SiteData) -> list[tuple[dict, object, object]]:
    """(doc, record, decision) of the newest atlas run per machine and model."""
    from kvbench.analysis.verdict import decide
    from kvbench.analysis.verdict_atlas import is_atlas
    from kvbench.records import parse_record

    newest: dict[tuple, tuple] = {}
    for doc in data.records:  # sorted by created_at
        try:
            record = parse_record({k: v for k, v in doc.items() if not k.startswith("_")})
        except Exception:  # a record the loader kept but the typed model refuses: not on this page
            continue
        if is_atlas(record):
            newest[(doc.get("machine"), (doc.get("config") or {}).get("model_name"))] = (doc, record, decide(record))
    return [newest[k] for k in sorted(newest, key=str)]


def _cells(r) -> list[str]:
    kld = "—" if r.kld is None else f"{r.kld:.2e}" + (f" [{r.kld_ci[0]:.1e}, {r.kld_ci[1]:.1e}]" if r.kld_ci else "")
    match = {True: "yes", False: f"no (model {r.model_tokens:,})" if r.model_tokens else "no", None: "—"}
    served = f'<span class="emulated">{esc(r.served)}</span>' if r.served == "emulated" else esc(r.served)
    return [
        esc(r.dtype),
        served,
        "—" if r.engine_tokens is None else f"{r.engine_tokens:,}",
        "—" if r.gain is None else f"{r.gain:.2f}x",
        esc(match[r.model_matches]),
        esc(r.verdict) if r.served not in ("refused", "failed") else "—",
        esc(kld),
        "—" if r.top1 is None else f"{r.top1:.1%}",
        esc(r.scales or "—"),
        esc(r.reason),
    ]


def table_html(rows) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in _cells(r)) + "</tr>" for r in rows)
    return f'<table class="data atlas-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def tradeoff_figure(rows, title: str) -> go.Figure:
    """Capacity gain over auto (x) against mean KLD at rest (y, log), one marker per measured dtype with its 95%
    interval; hollow for an emulated dtype. Auto (KLD 0 by construction) is the vertical line at 1x."""
    fig = go.Figure()
    for r in rows:
        if r.gain is None or r.kld is None or r.kld <= 0:
            continue
        lo, hi = r.kld_ci if r.kld_ci else (r.kld, r.kld)
        fig.add_trace(
            go.Scatter(
                x=[r.gain],
                y=[r.kld],
                mode="markers+text",
                text=[esc(r.dtype)],
                textposition="top center",
                name=esc(r.dtype),
                marker={
                    "color": color(r.dtype),
                    "symbol": symbol(r.dtype) + ("-open" if r.served == "emulated" else ""),
                    "size": 12,
                    "line": {"width": 2, "color": color(r.dtype)},
                },
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [max(hi - r.kld, 0)],
                    "arrayminus": [max(r.kld - max(lo, 1e-12), 0)],
                },  # fmt: skip
                hovertemplate=(
                    f"<b>{esc(r.dtype)}</b> ({esc(r.served)})<br>%{{x:.2f}}x auto's KV tokens<br>"
                    f"mean KLD %{{y:.2e}} nats/token<br>{esc(r.verdict)}<extra></extra>"
                ),
            )
        )
    fig.add_vline(x=1.0, line={"color": "#888", "dash": "dot"})
    fig.update_xaxes(title_text="KV tokens vs auto (engine-reported, same KV memory)")
    fig.update_yaxes(title_text="mean KLD vs auto at rest (nats/token, log)", type="log")
    return style(fig, title, height=480)


def build(data: SiteData) -> Page:
    page = Page(SLUG, TITLE)
    parts = page.heading(
        """Every --kv-cache-dtype the installed vLLM accepts, measured in one run (<code>kvbench run --kv-dtypes
        all</code>): how many KV tokens the engine fits in the same memory, the accuracy verdict against auto, and
        how far the dtype moves the model's next-token distribution (mean KLD per token, teacher-forced, at rest).
        <i>emulated</i>: stored in vLLM's page layout by kvbench's CPU backend (capacity and accuracy count, its
        speed does not); <i>refused</i>: vLLM's own reason, nothing started. The plot is the trade-off: further right
        holds more users, lower changes the model less."""
    )
    found = atlas_records(data)
    if not found:
        parts.append(
            empty(
                f"No atlas run under <code>{esc(data.results_dir)}</code>: <code>kvbench run --kv-dtypes all</code> "
                "measures every KV dtype the installed vLLM offers."
            )
        )
        return page.done(parts)
    from kvbench.analysis.verdict_atlas import rows as atlas_rows

    for doc, record, decision in found:
        rows = atlas_rows(record, decision)
        name = f"{doc.get('machine')} · {(doc.get('config') or {}).get('model_name')}"
        inner = note(
            f"Run <code>{esc(doc.get('run_id'))}</code>: recommended over all of them: "
            f"<b>{esc(decision.recommended or 'none')}</b> ({esc(decision.why)})."
        )
        inner += table_html(rows)
        inner += page.plot(tradeoff_figure(rows, "Capacity gain against KLD"), f"atlas-{slug(name)}")
        zero = [r.dtype for r in rows if r.kld == 0 and r.dtype != "auto"]
        if zero:  # a log axis has no 0: said, not dropped in silence
            inner += note(f"Mean KLD exactly 0 (not on the log axis): {esc(', '.join(zero))}.")
        parts.append(section(name, inner, anchor=slug(name)))
    return page.done(parts)
