"""One look for every page: a fixed colour and marker per KV dtype, and the plotly template.

Colours are the Okabe–Ito palette (safe for the common colour-vision deficiencies); every dtype also has
its own marker shape, so colour is never the only cue. The mapping is fixed, not assigned in order of
appearance, so fp8 is orange on every page whatever else a page shows.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go
import plotly.io as pio

from kvbench.specs import formats

# Each dtype's colour, marker and line dash, and the order legends and tables read in (most precise first;
# the recommendation breaks ties with it too), come from the KV-dtype registry, kvbench/data/formats.toml.
OTHER_COLOR = "#7F7F7F"
OTHER_SYMBOL = "hexagon"

# Verdicts and run states: words on the page carry the meaning; colour only reinforces it.
VERDICT_COLORS = {
    "holds": "#009E73",
    "off": "#E69F00",
    "fails": "#D55E00",
    "not decided": "#CC79A7",
    "not checkable": "#999999",
}
STATUS_OK = "#009E73"
STATUS_BAD = "#D55E00"
SLO_COLOR = "#D55E00"
REGRESSION_COLOR = "#D55E00"

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"


def color(dtype: str) -> str:
    return formats.look(dtype).get("color", OTHER_COLOR)


def symbol(dtype: str) -> str:
    return formats.look(dtype).get("marker", OTHER_SYMBOL)


def dash(dtype: str) -> str:
    return formats.look(dtype).get("dash", "solid")


def pattern(dtype: str) -> str:
    """Bar fill pattern ("" for a plain bar)."""
    return formats.look(dtype).get("pattern", "")


def colors() -> dict[str, str]:
    """{dtype: colour} for every dtype the registry gives one."""
    return {d: formats.look(d)["color"] for d in formats.dtype_order() if "color" in formats.look(d)}


def symbols() -> dict[str, str]:
    """{dtype: marker} for every dtype the registry gives one."""
    return {d: formats.look(d)["marker"] for d in formats.dtype_order() if "marker" in formats.look(d)}


def dtype_sort_key(dtype: str) -> tuple[float, str]:
    return formats.order_key(dtype)


def ordered(dtypes) -> list[str]:
    return sorted(set(dtypes), key=dtype_sort_key)


def esc(value) -> str:
    """Text from data, made safe both for HTML and for plotly's own pseudo-HTML in labels and hovers.

    Quotes become numeric entities: HTML attributes need them escaped, and plotly decodes numeric entities
    but shows a named `&quot;` literally."""
    text = html.escape("" if value is None else str(value), quote=False)
    return text.replace('"', "&#34;").replace("'", "&#39;")


TEMPLATE = go.layout.Template(pio.templates["plotly_white"])
TEMPLATE.layout.font = {"family": FONT, "size": 13, "color": "#222"}
TEMPLATE.layout.hoverlabel = {"font": {"family": FONT, "size": 12}, "align": "left"}
TEMPLATE.layout.legend = {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0}
TEMPLATE.layout.margin = {"l": 70, "r": 20, "t": 60, "b": 60}


TITLE_PX, LEGEND_PX, TOP_MARGIN_PX = 12, 44, 104  # title, then the legend, then subplot titles, from the top down


def style(fig: go.Figure, title: str | None = None, height: int = 420) -> go.Figure:
    """Template, height, and a title and legend stacked above the plots in pixels, so they never overlap
    each other or the subplot titles, whatever the figure's height."""
    fig.update_layout(
        template=TEMPLATE,
        height=height,
        title={
            "text": esc(title),
            "x": 0.01,
            "xanchor": "left",
            "yref": "container",
            "y": 1 - TITLE_PX / height,
            "yanchor": "top",
            "font": {"size": 16},
        }
        if title
        else None,
        legend={"yref": "container", "y": 1 - LEGEND_PX / height, "yanchor": "top"},
        margin={"t": TOP_MARGIN_PX},
    )
    return fig


def log_ticks(lo: float, hi: float, base: int = 2) -> list[float]:
    """Powers of `base` spanning [lo, hi], for log axes whose default minor labels clutter."""
    import math

    if not (lo and hi) or lo <= 0 or hi <= 0:
        return []
    first, last = math.floor(math.log(lo, base)), math.ceil(math.log(hi, base))
    return [float(base**k) for k in range(first, last + 1)]
