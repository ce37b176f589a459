"""`kvbench dashboard`: a static HTML site (plotly, no server, no network) from the results folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.markup import escape
from typer.core import TyperCommand

from kvbench.cli.clisettings import command_from
from kvbench.core.errors import UsageError
from kvbench.core.flags import Flag
from kvbench.core.output import console
from kvbench.specs.options import Results

NAME = "dashboard"
HELP = "Write static HTML pages from results/; they open from file:// with no network."  # + the pages: PagesHelp


def pages_help() -> str:
    """The command's help, naming every page the site registers (kvbench/dashboards/site.py PAGES)."""
    from kvbench.dashboards.site import PAGES

    titles = ", ".join(page.TITLE[:1].lower() + page.TITLE[1:] for page in PAGES)
    return f"Write static HTML pages from results/ ({titles}); they open from file:// with no network."


class PagesHelp(TyperCommand):
    """Reads the page registry only when help is shown: the site's modules (pandas, plotly) cost ~0.4 s to
    import, which no other command should pay."""

    @property
    def help(self) -> str:
        return pages_help()

    @help.setter
    def help(self, value) -> None:  # click sets it from HELP; the registry is the one source
        pass


COMMAND_CLASS = PagesHelp


class DashboardSettings(BaseModel):
    """What one `kvbench dashboard` is asked to do; the fields are the command's options, in --help order."""

    model_config = ConfigDict(extra="forbid")

    results: Results = Field(description="Results folder to read (results/<machine>/...).")
    out: Annotated[Path, Flag("--out")] = Field(
        Path("site"), description="Folder to write the site into (replaced as a whole on each build)."
    )
    asv_conf: Annotated[Path | None, Flag("--asv-conf")] = Field(
        None, description="asv.conf.json for the history (default: beside the results folder)."
    )
    claims_file: Annotated[Path | None, Flag("--claims")] = Field(
        None, description="Claims TOML for the claims page (default: the shipped article claims)."
    )


@command_from(DashboardSettings, lambda ctx, values: DashboardSettings(**values))
def command(ctx: typer.Context, s: DashboardSettings) -> None:
    from kvbench.dashboards import data as site_data
    from kvbench.dashboards.site import MARKER, write_site

    if not s.results.is_dir():  # a mistyped --results must not replace a good site with an empty one
        raise UsageError(f"--results {s.results}: no such folder; give the results folder (results/<machine>/...)")
    loaded = site_data.load(s.results, asv_conf=s.asv_conf, claims_file=s.claims_file)
    nothing = not loaded.records and loaded.history.empty and not loaded.kernel_records and loaded.accuracy.empty
    if nothing and (s.out / MARKER).exists():
        raise UsageError(
            f"--results {s.results} holds no results; not replacing the site at {s.out} with an empty one "
            "(remove that folder first to write an empty site)"
        )
    try:
        pages = write_site(loaded, s.out)
    except OSError as exc:  # --out under a file, a read-only or full disk: the old site, if any, is untouched
        raise UsageError(
            f"--out {s.out}: cannot write the site there ({exc.strerror or exc}); give another folder"
        ) from None
    machines = sorted({str(d.get("machine")) for d in loaded.records})
    console.print(
        f"{len(loaded.records)} run records ({', '.join(machines) or 'none'}), {len(loaded.history):,} history points, "
        f"{loaded.accuracy['path'].nunique() if not loaded.accuracy.empty else 0} accuracy "
        f"and {len(loaded.kernel_records)} kernel records"
    )
    for problem in loaded.problems:
        console.print(f"[yellow]skipped: {escape(problem)}[/]", markup=True, highlight=False, soft_wrap=True)
    console.print(f"wrote {len(pages)} pages: open {pages[0].resolve().as_uri()}")
