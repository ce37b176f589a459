"""One look for every page: a fixed colour and marker per KV dtype, and the plotly template.

Colours are the Okabe–Ito palette (safe for the common colour-vision deficiencies); every dtype also has
its own marker shape, so colour is never the only cue. The mapping is fixed, not assigned in order of
appearance, so fp8 is orange on every page whatever else a page shows.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go
import plotly.io as pio

# Most precise first: legends and tables read in this order, and the recommendation breaks ties with it.
DTYPE_ORDER = ("auto", "fp16", "bf16", "fp8", "fp8_e5m2", "nvfp4", "nvfp4_4over6", "mxfp4")
COLORS = {
    "auto": "#0072B2",  # blue
    "fp8": "#E69F00",  # orange
    "nvfp4": "#009E73",  # bluish green
    "fp8_e5m2": "#D55E00",  # vermillion
    "nvfp4_4over6": "#56B4E9",  # sky blue
    "mxfp4": "#CC79A7",  # reddish purple
    "fp16": "#000000",  # black
    "bf16": "#999999",  # grey
}
SYMBOLS = {
    "auto": "circle",
    "fp8": "square",
    "nvfp4": "diamond",
    "fp8_e5m2": "triangle-up",
    "nvfp4_4over6": "star",
    "mxfp4": "x",
    "fp16": "triangle-down",
    "bf16": "pentagon",
}
DASHES = {"auto": "solid", "fp8": "dash", "nvfp4": "dot", "fp8_e5m2": "dashdot"}
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
    return COLORS.get(dtype, OTHER_COLOR)


def symbol(dtype: str) -> str:
    return SYMBOLS.get(dtype, OTHER_SYMBOL)


def dash(dtype: str) -> str:
    return DASHES.get(dtype, "solid")


def dtype_sort_key(dtype: str) -> tuple[int, str]:
    return (DTYPE_ORDER.index(dtype) if dtype in DTYPE_ORDER else len(DTYPE_ORDER), str(dtype))


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
