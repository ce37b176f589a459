"""Every setting of `kvbench eval`, declared once: its flag, default, check and help (kvbench/core/flags.py's Flag,
shared options from kvbench/specs/options.py; the command line is generated from the fields by
kvbench/cli/clisettings.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from kvbench.core import cliargs
from kvbench.core.errors import UsageError
from kvbench.core.flags import Flag
from kvbench.specs import evaltasks
from kvbench.specs.options import (
    ApiKey,
    AsJson,
    Endpoint,
    Header,
    KvDtypes,
    Model,
    Results,
    StartupTimeout,
    default_kv_dtypes,
)


class EvalSettings(BaseModel):
    """What one `kvbench eval` is asked to do; the fields with a Flag are the command's options, in --help order."""

    model_config = ConfigDict(extra="forbid")

    model: Model = Field(
        None,
        description=(
            "HF id or local path (required with a GPU; CPU default: the trained tiny model). With --endpoint: a "
            "local copy of the served model's tokenizer."
        ),
    )
    kv_dtypes: KvDtypes = Field(
        None,
        description=(
            f"Comma-separated --kv-cache-dtype values (default {default_kv_dtypes()}; "
            "with --endpoint: what the servers run)."
        ),
    )
    tasks: Annotated[str | None, Flag("--tasks")] = Field(
        None,
        description=(
            f"Comma-separated lm-eval tasks (default {evaltasks.DEFAULT_TASK}; bundled: "
            f"kvbench_passkey_/kvbench_multikey_ + 512/1024/2048/4096; any lm-eval task whose data can be had, "
            f"e.g. gsm8k)."
        ),
    )
    limit: Annotated[int | None, Flag("--limit")] = Field(
        None, description=f"First N items of each task (default: all; bundled tasks have {evaltasks.DEFAULT_ITEMS})."
    )
    max_seq_lengths: Annotated[str | None, Flag("--max-seq-lengths")] = Field(
        None,
        description=(
            "Comma-separated context lengths in tokens at which lm-eval's synthetic long-context tasks (ruler, "
            "niah_*) generate their items, e.g. 4096,8192 (lm-eval's metadata max_seq_lengths)."
        ),
    )
    concurrency: Annotated[int | None, Flag("--concurrency")] = Field(
        None,
        description=(
            "Requests in flight for the at-load pass (default: the backend's serving concurrency). The at-rest "
            "pass is 1."
        ),
    )
    max_model_len: Annotated[int | None, Flag("--max-model-len")] = Field(
        None, description="vLLM --max-model-len (default: the backend default, or what the bundled tasks need)."
    )
    endpoint: Endpoint = Field(
        None,
        description=(
            "Evaluate running servers instead: URL (one server, its dtype read from /metrics) or auto=URL1,fp8=URL2,..."
        ),
    )
    api_key: ApiKey
    header: Header
    results: Results = Field(
        Path("results"), description="Where records go: <dir>/<machine>/evals/<id>.json (+ .items.parquet)."
    )
    startup_timeout: StartupTimeout
    as_json: AsJson = Field(False, description="Print one JSON document on stdout (progress goes to stderr).")

    # -- not flags: vLLM's own arguments (after -- on the command line) -------------------------------------------
    extra_args: list[str] = Field(default_factory=list)

    # what the checks parsed: the task list, the lengths, the request headers
    _task_list: list[str] = PrivateAttr(default_factory=list)
    _lengths: list[int] | None = PrivateAttr(None)
    _headers: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def task_list(self) -> list[str]:
        return self._task_list

    @property
    def lengths(self) -> list[int] | None:
        return self._lengths

    @property
    def headers(self) -> dict[str, str]:
        return self._headers

    @model_validator(mode="after")
    def _check(self) -> EvalSettings:
        """Every flag checked before any server (or the tiny model's training) starts. The task names come last:
        an lm-eval task is looked up in lm-eval's index (~5 s to build), which a mistyped number need not wait for."""
        self._task_list = (
            cliargs.names(self.tasks, "--tasks", evaltasks.DEFAULT_TASK)
            if self.tasks is not None
            else [evaltasks.DEFAULT_TASK]
        )
        if self.max_seq_lengths:
            self._lengths = cliargs.int_list(self.max_seq_lengths, "--max-seq-lengths", "4096,8192")
        cliargs.at_least_one(self.limit, "--limit")
        cliargs.at_least_one(self.concurrency, "--concurrency")
        cliargs.at_least_one(self.max_model_len, "--max-model-len")
        self._headers = self._request_headers()
        if self.endpoint is not None and self.extra_args:
            raise UsageError(
                f"vLLM arguments after -- ({' '.join(self.extra_args)}) apply only when kvbench starts the server; "
                "drop them with --endpoint"
            )
        evaltasks.check_task_names(self._task_list)
        return self

    def _request_headers(self) -> dict[str, str]:
        from kvbench.harness.server.endpoint import check_api_key, parse_headers, request_headers

        key = None if self.api_key is None else check_api_key(self.api_key)
        return request_headers(parse_headers(self.header), key, self.endpoint is not None)
