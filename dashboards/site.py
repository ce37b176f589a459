"""The static site: page shell and navigation, one bundled copy of plotly.js, written all at once.

The site is built in a temporary folder beside the target and swapped in with renames, so a browser
never loads a half-written page and a failed build leaves the previous site as it was. It opens from
file:// with no network: pages load `assets/plotly.min.js` by a relative path.
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from kvbench import __version__
from kvbench.core.errors import UsageError
from kvbench.dashboards import (
    page_atlas,
    page_capacity,
    page_claims,
    page_gpus,
    page_history,
    page_kernels,
    page_latency,
    page_overview,
    page_quality,
    page_tradeoff,
)
from kvbench.dashboards.components import Page
from kvbench.dashboards.data import SiteData
from kvbench.dashboards.theme import esc

PAGES = (
    page_overview,
    page_history,
    page_gpus,
    page_capacity,
    page_latency,
    page_tradeoff,
    page_quality,
    page_atlas,
    page_claims,
    page_kernels,
)
MARKER = ".kvbench-dashboard"  # only folders carrying it are ever replaced
PLOTLY_JS = "assets/plotly.min.js"
STYLE_CSS = "assets/style.css"

CSS = """
:root { --ink:#222; --muted:#5f6368; --line:#dde1e6; --bg:#fafbfc; --warn:#D55E00; --ok:#009E73; }
* { box-sizing:border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,sans-serif;
       color:var(--ink); background:var(--bg); }
nav { position:sticky; top:0; z-index:10; background:#1f2a37; padding:0 24px; display:flex; flex-wrap:wrap; gap:2px; }
nav a { color:#d7dde5; text-decoration:none; padding:12px 12px; font-weight:500; }
nav a.here, nav a:hover { color:#fff; background:#33475b; }
nav .brand { color:#fff; font-weight:700; margin-right:12px; }
main { max-width:1400px; margin:0 auto; padding:8px 24px 32px; }
h1 { font-size:24px; margin:18px 0 4px; }
h2 { font-size:18px; margin:26px 0 8px; border-bottom:1px solid var(--line); padding-bottom:4px; }
h3 { font-size:15px; margin:18px 0 6px; }
p.lead { color:var(--muted); margin:0 0 12px; max-width:1000px; }
section { margin-bottom:18px; }
.figure { background:#fff; border:1px solid var(--line); border-radius:6px; margin:10px 0; padding:4px; }
table.data { border-collapse:collapse; background:#fff; margin:8px 0; font-size:13px; }
table.data th, table.data td { border:1px solid var(--line); padding:5px 9px; text-align:left; vertical-align:top; }
table.data th { background:#f0f3f6; font-weight:600; }
table.data td.num { text-align:right; font-variant-numeric:tabular-nums; }
.empty { border:2px dashed #b8c0ca; border-radius:6px; padding:18px; margin:10px 0; color:#39424e; background:#fff; }
.note { border-left:5px solid #0072B2; background:#eef5fb; padding:10px 14px; margin:10px 0; border-radius:3px; }
.note.warn { border-left-color:var(--warn); background:#fdf0e8; }
.note.ok { border-left-color:var(--ok); background:#e9f7f2; }
.note.finding { border-left-color:var(--warn); background:#fdf0e8; font-size:15px; font-weight:600; }
.recommend { border:2px solid var(--ok); background:#fff; border-radius:6px; padding:10px 16px; margin:10px 0; }
.recommend .pick { font-size:20px; font-weight:700; }
.badge { display:inline-block; border:1.5px solid; border-radius:10px; padding:0 8px; \
font-size:12px; font-weight:600; background:#fff; }
.emulated { color:#9aa1a9; font-style:italic; text-decoration:underline dotted; cursor:help; }
.chip { display:inline-block; width:11px; height:11px; border-radius:2px; margin-right:6px; vertical-align:-1px; }
code, pre { font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; font-size:12.5px; }
pre { background:#f3f4f6; padding:8px; border-radius:4px; white-space:pre-wrap; max-height:220px; overflow:auto; }
footer { color:var(--muted); font-size:12px; border-top:1px solid var(--line); margin-top:30px; padding-top:8px; }
"""


def render_page(page: Page, pages: list[Page], data: SiteData, generated_at: str) -> str:
    here = ' class="here"'
    nav = "".join(f'<a href="{p.slug}.html"{here if p.slug == page.slug else ""}>{esc(p.title)}</a>' for p in pages)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(page.title)} · kvbench</title>
<link rel="stylesheet" href="{STYLE_CSS}">
<script src="{PLOTLY_JS}"></script>
</head>
<body>
<nav><a class="brand" href="index.html">kvbench</a>{nav}</nav>
<main>
{page.body}
<footer>Built by kvbench {esc(__version__)} from <code>{esc(data.results_dir)}</code> at {esc(generated_at)}.
Every number is read from the records under that folder or derived from them in code.</footer>
</main>
</body>
</html>
"""


def _plotly_js() -> bytes:
    """plotly.js from the installed plotly package, so the site needs no network (and matches the Python side)."""
    bundled = importlib.resources.files("plotly") / "package_data" / "plotly.min.js"
    if bundled.is_file():
        return bundled.read_bytes()
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()


def build_pages(data: SiteData) -> list[Page]:
    pages = [module.build(data) for module in PAGES]
    pages[0].slug = "index"  # the overview opens first
    return pages


def write_site(data: SiteData, out_dir: str | Path, generated_at: str | None = None) -> list[Path]:
    """Build every page and swap the finished folder in; returns the written pages' paths."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise UsageError(
            f"refusing to replace {out}: it exists and is not a folder kvbench dashboard wrote; choose another --out"
        )
    generated_at = generated_at or datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    pages = build_pages(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / "assets").mkdir()
        (tmp / PLOTLY_JS).write_bytes(_plotly_js())
        (tmp / STYLE_CSS).write_text(CSS)
        for name, content in page_claims.source_files(data).items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(content)
        for page in pages:
            (tmp / f"{page.slug}.html").write_text(render_page(page, pages, data, generated_at), encoding="utf-8")
        (tmp / MARKER).write_text("written by `kvbench dashboard`; the whole folder is replaced on each build\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; the site is for everyone to read
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / f"{p.slug}.html" for p in pages]


def _swap_in(new: Path, out: Path) -> None:
    """Replace `out` by `new` with renames: the old site stays whole until the new one is in place."""
    if not out.exists():
        os.replace(new, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    old.rmdir()
    os.replace(out, old)
    try:
        os.replace(new, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
