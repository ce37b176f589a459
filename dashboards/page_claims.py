"""Claims: every claim of the article with claimed / derived / measured / verdict, linked to its source."""

from __future__ import annotations

from urllib.parse import urlsplit

import pandas as pd
import plotly.graph_objects as go

from kvbench.dashboards.components import Page, badge, empty, section, table
from kvbench.dashboards.data import SiteData
from kvbench.dashboards.theme import VERDICT_COLORS, esc, style

SLUG, TITLE = "claims", "Claims"
SOURCES_DIR = "sources"


def source_files(data: SiteData) -> dict[str, bytes]:
    """The claims' source file (inside the claims folder: kvbench.analysis.claims refuses any other) copied into the
    site, so the page links to it from file:// with no network."""
    source = (data.claims or {}).get("source")
    path = getattr(source, "file", None)
    return {f"{SOURCES_DIR}/{path.name}": path.read_bytes()} if path else {}


def source_link(doc: dict) -> str:
    """The source named by title, publisher and date; linked only through an http(s) URL or the copied file."""
    source = (doc or {}).get("source")
    if source is None:
        return "no source given"
    named = esc(", ".join(x for x in (source.title, source.publisher, source.date) if x))
    links = []
    if source.url and urlsplit(source.url).scheme in ("http", "https"):
        links.append(f'<a href="{esc(source.url)}" rel="noopener noreferrer">{esc(source.url)}</a>')
    if source.file:
        links.append(f'<a href="{SOURCES_DIR}/{esc(source.file.name)}">{esc(source.file.name)}</a>')
    if not named and not links:
        return "no source given"
    return named + (f" ({', '.join(links)})" if links else "")


def _value(v, unit: str) -> str:
    """As `kvbench claims` prints it: whole users and GPUs, else four significant digits."""
    if v is None:
        return "—"
    if isinstance(v, str):
        return esc(v)
    text = f"{float(v):,.0f}" if unit in ("users", "GPUs") else f"{float(v):,.4g}"
    return esc(f"{text} {unit}".strip())


def verdict_figure(frame: pd.DataFrame, title: str) -> go.Figure:
    """Derived vs claimed, in % per claim, coloured and labelled by verdict, with the tolerance bands."""
    f = frame.dropna(subset=["delta_pct"]).iloc[::-1]
    fig = go.Figure()
    for verdict, part in f.groupby("verdict", sort=False):
        fig.add_trace(
            go.Bar(
                y=[esc(i) for i in part["id"]],
                x=part["delta_pct"],
                orientation="h",
                name=esc(verdict),
                marker={"color": VERDICT_COLORS.get(verdict, "#999")},
                text=[esc(t) for t in part["label"]],
                textposition="outside",
                customdata=[
                    [
                        esc(r["text"]),
                        _value(r["claimed"], r["unit"]),
                        _value(r["derived"], r["unit"]),
                        esc(r["label"]),
                        esc(title),
                    ]
                    for _, r in part.iterrows()
                ],
                hovertemplate=(
                    "<b>%{customdata[0]}</b><br>claimed %{customdata[1]}, derived %{customdata[2]}<br>"
                    "derived − claimed: %{x:+.1f}% → %{customdata[3]}<br>derived from kvbench's specs (no run); "
                    "source: %{customdata[4]}<extra></extra>"
                ),
            )
        )
    tol = float(frame["tolerance_pct"].dropna().max()) if frame["tolerance_pct"].notna().any() else None
    if tol:
        fig.add_vrect(
            x0=-tol,
            x1=tol,
            fillcolor="#009E73",
            opacity=0.10,
            line_width=0,
            annotation={"text": f"holds: within ±{tol:g}%", "font": {"size": 11}},
            annotation_position="outside top",
        )
    lo, hi = float(f["delta_pct"].min()), float(f["delta_pct"].max())
    pad = max(8.0, 0.22 * (max(hi, 0) - min(lo, 0)))  # room for the verdict labels outside the bars
    fig.update_xaxes(
        title_text="derived vs claimed (%)",
        zeroline=True,
        zerolinecolor="#444",
        range=[min(lo, 0) - pad, max(hi, 0) + pad],
    )
    # claims top to bottom in the file's order, whatever trace (verdict) they are in
    fig.update_yaxes(
        title_text="claim", automargin=True, categoryorder="array", categoryarray=[esc(i) for i in f["id"]]
    )
    style(fig, "How far each claim is from what kvbench derives", height=max(380, 26 * len(f) + 140))
    fig.update_layout(barmode="overlay")
    return fig


def build(data: SiteData) -> Page:
    page = Page(SLUG, TITLE)
    parts = page.heading()
    if data.claims is None or not data.verdicts:
        parts.append(
            empty(
                "No claims file could be read — <code>kvbench claims --file F</code> checks one; the shipped "
                "file is <code>kvbench/data/claims/nvfp4-kv-cache-article.toml</code>."
            )
        )
        return page.done(parts)
    doc = data.claims
    title = doc.get("title", "claims")
    tolerance = {c["id"]: c.get("tolerance_pct") for c in doc.get("claims", [])}
    frame = pd.DataFrame([{**vars(v), "label": v.label, "tolerance_pct": tolerance.get(v.id)} for v in data.verdicts])
    counts = frame["verdict"].value_counts()
    summary = ", ".join(f"{int(counts[k])} {k}" for k in VERDICT_COLORS if k in counts)
    parts.append(
        f'<p class="lead"><b>{esc(title)}</b> — source: {source_link(doc)}. '
        "kvbench re-derives every numeric claim from its "
        "model, GPU and format specs (<code>kvbench claims</code>); "
        "a measured value appears where a run of the same model, "
        f"context and KV budget exists. {esc(summary)}.</p>"
    )
    parts.append(page.plot(verdict_figure(frame, title), "claims-verdicts"))
    view = frame.copy()
    view["claim"] = [
        f"{esc(r['text'])}<br><small><code>{esc(r['id'])}</code> · {esc(r['where'])}"
        + (f" · source: {esc(r['source'])}" if isinstance(r.get("source"), str) else "")
        + "</small>"
        for _, r in view.iterrows()
    ]
    view["claimed_t"] = [_value(v, u) for v, u in zip(view["claimed"], view["unit"], strict=False)]
    view["derived_t"] = [
        _value(None if pd.isna(v) else v, u) for v, u in zip(view["derived"], view["unit"], strict=False)
    ]
    view["measured_t"] = [
        _value(m, u) if not pd.isna(m) else ("not measured yet" if isinstance(ms, str) and ms else "—")
        for m, u, ms in zip(view["measured"], view["unit"], view["measure"], strict=False)
    ]
    view["verdict_t"] = [
        badge(lbl, VERDICT_COLORS.get(v, "#999")) for v, lbl in zip(view["verdict"], view["label"], strict=False)
    ]
    parts.append(
        section(
            "Every claim",
            table(
                view,
                {
                    "claim": "claim (where in the source)",
                    "claimed_t": "claimed",
                    "derived_t": "derived",
                    "measured_t": "measured",
                    "verdict_t": "verdict",
                    "derivation": "how kvbench derived it",
                },
                raw={"claim", "claimed_t", "derived_t", "measured_t", "verdict_t"},
            ),
        )
    )
    return page.done(parts)
