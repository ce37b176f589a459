"""Pieces every page uses: figure divs, tables, notes and empty states, hover text, number formats.

Every string that comes from data goes through `esc` (html.escape) before it lands in HTML or in a plotly
label (plotly reads labels as a small HTML subset, so an unescaped `<b>` in a model name would format).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go

from kvbench.dashboards.theme import esc

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"scale": 2}}

# The four facts every hover carries (issue: run id, date, vLLM version, machine).
HOVER_KEYS = ("run_id", "date", "vllm", "machine")


@dataclass
class Page:
    slug: str  # file name without .html
    title: str  # nav and <title>
    body: str = ""
    figures: list[tuple[str, go.Figure]] = field(default_factory=list)  # (div id, figure): every plot on the page

    def plot(self, fig: go.Figure, div_id: str) -> str:
        """The figure's div, recorded so tests (and the browser test) know every plot the page holds."""
        self.figures.append((div_id, fig))
        return fig_div(fig, div_id)

    def heading(self, lead_html: str | None = None) -> list[str]:
        """The page's first parts: its title and, where given, the lead paragraph that says what it shows (its
        white space folded, so a page can write it as a wrapped triple-quoted paragraph)."""
        lead = [f'<p class="lead">{" ".join(lead_html.split())}</p>'] if lead_html is not None else []
        return [f"<h1>{esc(self.title)}</h1>", *lead]

    def done(self, parts: list[str]) -> Page:
        """The page with `parts` as its body (what every page's build returns)."""
        self.body = "\n".join(parts)
        return self


def vline(fig: go.Figure, x, line: dict, row: int, col: int) -> None:
    """A vertical line across one subplot: the shape fig.add_vline(x, row=, col=) adds, without add_vline's scan
    of every trace for each line (a history page draws one per vLLM release per chart: ~0.6 s a site)."""
    sub = fig.get_subplot(row, col)
    xref = sub.xaxis.plotly_name.replace("axis", "")  # "xaxis2" -> "x2"
    yref = sub.yaxis.plotly_name.replace("axis", "")
    fig.add_shape(type="line", x0=x, x1=x, y0=0, y1=1, xref=xref, yref=f"{yref} domain", line=line)


def fig_div(fig: go.Figure, div_id: str) -> str:
    """A figure as a div that uses the site's one copy of plotly.js (loaded by the page shell)."""
    return (
        '<div class="figure">'
        + fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOTLY_CONFIG)
        + "</div>"
    )


def fmt(value, digits: int = 1, unit: str = "") -> str:
    """A number for a table cell; '—' when there is none."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "—"
    if isinstance(value, (int,)) or (isinstance(value, float) and value.is_integer() and abs(value) >= 100):
        text = f"{value:,.0f}"
    else:
        text = f"{value:,.{digits}f}"
    return f"{text} {unit}".strip()


def is_missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def text(value) -> str:
    """A text cell's content, '' when absent (pandas stores absent text as NaN)."""
    return "" if is_missing(value) else str(value)


def date_text(value) -> str:
    if is_missing(value):
        return "?"
    ts = pd.Timestamp(value)
    return ts.strftime("%Y-%m-%d %H:%M UTC") if ts.tzinfo else ts.strftime("%Y-%m-%d %H:%M")


def hover_data(
    frame: pd.DataFrame, run_id="run_id", date="created_at", vllm="vllm_version", machine="machine", extra=()
) -> list[list[str]]:
    """customdata rows, escaped: run id, date, vLLM version, machine, then any extra columns."""
    out = []
    for _, row in frame.iterrows():
        vals = [row.get(run_id), date_text(row.get(date)), row.get(vllm), row.get(machine)]
        vals += [row.get(c) for c in extra]
        out.append([esc("—" if is_missing(v) else v) for v in vals])
    return out


def hover_template(lines: list[str], first_extra: int = 4) -> str:
    """Lines above the four standard facts; `lines` may use %{customdata[4+]} for extra columns."""
    standard = "run %{customdata[0]}<br>%{customdata[1]}<br>vLLM %{customdata[2]}<br>machine %{customdata[3]}"
    return "<br>".join([*lines, standard]) + "<extra></extra>"


def table(
    frame: pd.DataFrame,
    columns: dict[str, str],
    raw: set[str] = frozenset(),
    classes: str = "data",
    numeric: set[str] = frozenset(),
) -> str:
    """An HTML table from a frame. Cells are escaped unless their column is in `raw` (cells the page built
    itself from escaped parts); `numeric` columns are right-aligned."""
    head = "".join(f"<th>{esc(title)}</th>" for title in columns.values())
    body = []
    for _, row in frame.iterrows():
        cells = []
        for col in columns:
            value = row.get(col)
            text = value if col in raw else esc("—" if is_missing(value) else value)
            cells.append(f'<td class="num">{text}</td>' if col in numeric else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="{classes}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def empty(message_html: str) -> str:
    """An empty state: what is missing and the command that fills it (message built from escaped parts)."""
    return f'<div class="empty">{message_html}</div>'


def note(message_html: str, kind: str = "info") -> str:
    return f'<div class="note {kind}">{message_html}</div>'


def section(title: str, inner: str, anchor: str | None = None) -> str:
    a = f' id="{esc(anchor)}"' if anchor else ""
    return f"<section{a}><h2>{esc(title)}</h2>{inner}</section>"


def badge(text: str, color: str) -> str:
    return f'<span class="badge" style="border-color:{color};color:{color}">{esc(text)}</span>'


def dtype_chip(dtype: str) -> str:
    """The dtype's colour and marker in text, so tables use the same cue as the plots."""
    from kvbench.dashboards.theme import color

    return f'<span class="chip" style="background:{color(dtype)}"></span>{esc(dtype)}'


def speed(value_text: str, emulated) -> str:
    """A speed cell (HTML): greyed, with the reason on hover, where the dtype was emulated."""
    from kvbench.records import EMULATED_SPEED_REASON

    if not emulated or value_text == "—":
        return esc(value_text)
    return f'<span class="emulated" title="{esc(EMULATED_SPEED_REASON)}">{esc(value_text)}</span>'


def emulated_note(frame: pd.DataFrame) -> str:
    """Which dtypes on the page were emulated, and why their speed is greyed out (empty when none were)."""
    from kvbench.records import EMULATED_SPEED_REASON

    if frame.empty or "emulated" not in frame or not frame["emulated"].fillna(False).astype(bool).any():
        return ""
    rows = frame[frame["emulated"].fillna(False).astype(bool)]
    which = sorted({f"{d} on {m}" for d, m in zip(rows["kv_cache_dtype"], rows["machine"], strict=False)})
    return note(
        f"<b>Emulated:</b> {esc(', '.join(which))}. Greyed-out numbers are "
        f"{esc(EMULATED_SPEED_REASON.removeprefix('emulated: '))}; they are kept but never compared, tracked, "
        "drawn as a front or used to recommend. Capacity, prefix-cache hits and accuracy are the format's own.",
        "warn",
    )


def slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in str(text).lower()).strip("-") or "x"
