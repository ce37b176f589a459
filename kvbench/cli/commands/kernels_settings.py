"""Every setting of `kvbench kernels`, declared once: its flag, default, check and help (kvbench/core/flags.py's
Flag, shared options from kvbench/specs/options.py; the command line is generated from the fields by
kvbench/cli/clisettings.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvbench.core import cliargs
from kvbench.core.errors import UsageError
from kvbench.core.flags import Flag
from kvbench.kernels.names import KERNEL_FORMATS
from kvbench.specs.formats import kernel_formats, speed_kernels
from kvbench.specs.options import AsJson, KvDtypes, Model, Results

GPU_GRID = {"contexts": "1024,4096,16384,32768,131072", "batches": "1,8,32"}
INTERPRET_GRID = {"contexts": "32,64", "batches": "1,2"}


class KernelsSettings(BaseModel):
    """What one `kvbench kernels` is asked to do; the fields are the command's options, in --help order."""

    model_config = ConfigDict(extra="forbid")

    model: Model = Field("llama-3.1-8b", description="Attention shape from this model (heads, KV heads, head_dim).")
    formats: Annotated[KvDtypes, Flag("--kv-dtypes", cli=str, hidden=("--formats",))] = Field(
        ",".join(speed_kernels()), description=f"Comma-separated: {', '.join(KERNEL_FORMATS)}."
    )
    contexts: Annotated[str | None, Flag("--contexts")] = Field(
        None, description=f"Decode context lengths in tokens (default {GPU_GRID['contexts']})."
    )
    batches: Annotated[str | None, Flag("--batches")] = Field(
        None, description=f"Decode batch sizes (default {GPU_GRID['batches']})."
    )
    write_tokens: Annotated[str | None, Flag("--write-tokens")] = Field(
        None,
        description=(
            "Tokens per reshape-and-cache call (default: each batch size, "
            "i.e. a decode step, and each context, i.e. a prefill)."
        ),
    )
    gpu: Annotated[str | None, Flag("--gpu", "-g")] = Field(
        None, description="Catalog entry for the peak bandwidth (default: matched from the device name)."
    )
    block_size: Annotated[int, Flag("--block-size")] = Field(
        16, description="Tokens per page (vLLM's CUDA default 16)."
    )
    max_cache_gb: Annotated[float | None, Flag("--max-cache-gb")] = Field(
        None, description="Skip cases whose cache needs more than this (default: 40% of free GPU memory)."
    )
    max_seconds: Annotated[float | None, Flag("--max-seconds")] = Field(
        None, description="Stop starting new cases after this many seconds; the record says 'partial'."
    )
    interpret: Annotated[bool, Flag("--interpret")] = Field(
        False, description="Run in Triton's interpreter on the CPU (tiny grid; times are not GPU times)."
    )
    results_dir: Results = Field(Path("results"), description="Where records go: <dir>/<machine>/kernels/<time>.json.")
    record: Annotated[bool, Flag("--record/--no-record")] = Field(True, description="Write the record.")
    as_json: AsJson = Field(description="Print the record as JSON instead of tables.")

    def grid(self) -> tuple[list[str], list[int], list[int], list[int]]:
        """(formats, contexts, batches, write sizes): the flags, or the grid for the GPU or the interpreter."""
        fmts = cliargs.choices(self.formats, "--kv-dtypes", kernel_formats("cache_kernel"), "KV format")
        grid = INTERPRET_GRID if self.interpret else GPU_GRID
        ctxs = cliargs.int_list(self.contexts or grid["contexts"], "--contexts", GPU_GRID["contexts"])
        bats = cliargs.int_list(self.batches or grid["batches"], "--batches", GPU_GRID["batches"])
        wtok = (
            cliargs.int_list(self.write_tokens, "--write-tokens", "16,4096")
            if self.write_tokens
            else sorted(set(bats) | set(ctxs))
        )
        return fmts, ctxs, bats, wtok

    @model_validator(mode="after")
    def _check(self) -> KernelsSettings:
        """The flag checks, in the order the command always made them (the first wrong flag is the one named)."""
        self.grid()
        cliargs.positive(self.max_cache_gb, "--max-cache-gb", "GB")
        cliargs.positive(self.max_seconds, "--max-seconds", "s")
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise UsageError(f"--block-size must be a power of two, got {self.block_size}")
        if self.gpu is not None:
            from kvbench.specs.gpus import get_gpu

            get_gpu(self.gpu)  # unknown names: one line with the choices
        return self
