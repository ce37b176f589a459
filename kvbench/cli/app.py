"""The `kvbench` command: one typer app, one module per subcommand under kvbench/cli/commands/."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from kvbench.core.errors import KvbenchError, UsageError
from kvbench.core.scrub import excerpt, printing_scrubbed

app = typer.Typer(
    name="kvbench",
    help="What a KV-cache precision (fp16/bf16, fp8, nvfp4) buys on each GPU: derived, measured, tracked.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Importing the commands reads the data catalogs (formats.toml ...): a broken $KVBENCH_DATA_DIR overlay raises
# its one-line UsageError here, which main() prints instead of a traceback, even for --help (N-P12).
try:
    from kvbench.cli.commands import (
        accuracy,
        capacity,
        claims,
        compare,
        dashboard,
        history,
        kernels,
        models,
        nightly,
        plan,
        regress,
        report,
        run,
        tinymodel,
    )
    from kvbench.cli.commands import eval as eval_cmd
except KvbenchError as exc:
    IMPORT_ERROR: KvbenchError | None = exc
else:
    IMPORT_ERROR = None
for module in (
    ()
    if IMPORT_ERROR
    else (
        capacity,
        claims,
        plan,
        run,
        eval_cmd,
        report,
        accuracy,
        kernels,
        dashboard,
        history,
        regress,
        compare,
        nightly,
    )
):
    app.command(
        module.NAME,
        help=escape(module.HELP),  # help is plain text: "[fleet]" stays as written (N-P7)
        context_settings=getattr(module, "CONTEXT_SETTINGS", None),
        cls=getattr(module, "COMMAND_CLASS", None),  # dashboard: its help names the registered pages
    )(module.command)
if IMPORT_ERROR is None:
    app.add_typer(tinymodel.app, name=tinymodel.NAME, help=tinymodel.HELP)  # a group: train, verify, accuracy
    app.add_typer(models.app, name=models.NAME, help=models.HELP)  # a group: list, prepare


def main(argv: list[str] | None = None) -> None:
    """Entry point: errors become one line on stderr and a non-zero exit, never a traceback."""
    args = sys.argv[1:] if argv is None else argv
    if IMPORT_ERROR is not None:
        print(f"kvbench: error: {excerpt(str(IMPORT_ERROR), 4000)}", file=sys.stderr)
        sys.exit(IMPORT_ERROR.exit_code)
    from kvbench.records import skipped_records

    seen = len(skipped_records())
    try:
        with printing_scrubbed():  # every byte printed is as clean as every byte stored
            rc = app(args=args, prog_name="kvbench", standalone_mode=False)
        left_out = sorted(set(skipped_records()[seen:]))
        if left_out:  # what could be shown without them was; the damage is never silent (issue 42)
            raise UsageError(
                f"{len(left_out)} run record{'s' if len(left_out) != 1 else ''} could not be read and "
                f"{'were' if len(left_out) != 1 else 'was'} left out (named above); restore or remove "
                f"{'them' if len(left_out) != 1 else 'it'}"
            )
    except KvbenchError as exc:
        # one line, no control characters or escape sequences, no credential (the text may quote a server)
        print(f"kvbench: error: {excerpt(str(exc), 4000)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("kvbench: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        # Parse errors from click (or the click that typer >= 0.29 vendors): duck-typed on purpose.
        if not hasattr(exc, "format_message"):
            if type(exc).__name__ == "Abort":
                print("kvbench: interrupted", file=sys.stderr)
                sys.exit(130)
            raise
        ctx = getattr(exc, "ctx", None)
        where = f"kvbench {ctx.info_name}" if ctx is not None and ctx.info_name != "kvbench" else "kvbench"
        message = " ".join(exc.format_message().split())
        if message.startswith("No such command"):
            message = (
                f"{message.rstrip('.')}; choose from: {', '.join(sorted(c.name for c in app.registered_commands))}"
            )
        if message:  # empty when typer already printed the help (no arguments)
            print(f"{where}: error: {message}", file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(rc if isinstance(rc, int) else 0)
