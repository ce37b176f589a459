"""`kvbench dashboard`: a static HTML site (plotly, no server, no network) from the results folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvbench.errors import UsageError
from kvbench.output import console

NAME = "dashboard"
HELP = (
    "Write static HTML pages from results/ (overview, history, across GPUs, capacity, latency under load, claims, "
    "kernels and accuracy); they open from file:// with no network."
)


def command(
    results: Annotated[Path, typer.Option("--results", help="Results folder to read (results/<machine>/...).")] = Path(
        "results"
    ),
    out: Annotated[
        Path, typer.Option("--out", help="Folder to write the site into (replaced as a whole on each build).")
    ] = Path("site"),
    asv_conf: Annotated[
        Path | None,
        typer.Option("--asv-conf", help="asv.conf.json for the history (default: beside the results folder)."),
    ] = None,
    claims_file: Annotated[
        Path | None,
        typer.Option("--claims", help="Claims TOML for the claims page (default: the shipped article claims)."),
    ] = None,
) -> None:
    from kvbench.dashboards import data as site_data
    from kvbench.dashboards.site import MARKER, write_site

    if not results.is_dir():  # a mistyped --results must not replace a good site with an empty one
        raise UsageError(f"--results {results}: no such folder; give the results folder (results/<machine>/...)")
    loaded = site_data.load(results, asv_conf=asv_conf, claims_file=claims_file)
    nothing = not loaded.records and loaded.history.empty and not loaded.kernel_records and loaded.accuracy.empty
    if nothing and (out / MARKER).exists():
        raise UsageError(
            f"--results {results} holds no results; not replacing the site at {out} with an empty one "
            "(remove that folder first to write an empty site)"
        )
    try:
        pages = write_site(loaded, out)
    except OSError as exc:  # --out under a file, a read-only or full disk: the old site, if any, is untouched
        raise UsageError(
            f"--out {out}: cannot write the site there ({exc.strerror or exc}); give another folder"
        ) from None
    machines = sorted({str(d.get("machine")) for d in loaded.records})
    console.print(
        f"{len(loaded.records)} run records ({', '.join(machines) or 'none'}), {len(loaded.history):,} history points, "
        f"{loaded.accuracy['path'].nunique() if not loaded.accuracy.empty else 0} accuracy "
        f"and {len(loaded.kernel_records)} kernel records"
    )
    for problem in loaded.problems:
        console.print(f"[yellow]skipped: {problem}[/]", markup=True, highlight=False)
    console.print(f"wrote {len(pages)} pages: open {pages[0].resolve().as_uri()}")
