"""Every setting of `kvbench run`, declared once: its flag, its type, its default (or the run_defaults.toml key
the backend's default comes from), its check and its help. The command line is generated from these fields
(kvbench/cli/clisettings.py), the harness plans from them (harness/run/defaults.py build_plan), and the asv suite,
the nightly matrix and the tests build the same object: RunSettings.for_machine(on_gpu, **values).

A flag that is not given stays None here: the plan tells "not given" from a value (a fixed workload's own
lengths, the CPU default's fixed KV cache) and only then takes the backend's default (`or_default`).
Checks fail with one-line UsageErrors naming the flag and the valid form (exit 2 through kvbench.cli.app); pydantic
passes them through as they are (a UsageError is no ValueError).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvbench.core import cliargs
from kvbench.core.datafiles import load_toml
from kvbench.core.errors import UsageError
from kvbench.core.flags import Flag, flag_of
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
    parsed,
)

UNKNOWN_DTYPES = ("error", "record")
ALL_DTYPES = "all"  # --kv-dtypes all: every --kv-cache-dtype the installed vLLM accepts (harness/run/defaults.py)
APIS = ("completions", "chat")
SLO_KEYS = ("ttft_p95_ms", "tpot_p95_ms")


def parse_slo(text: str) -> dict[str, float]:
    return cliargs.key_numbers(text, "--search-slo", SLO_KEYS, unit="ms", example="ttft_p95_ms=250,tpot_p95_ms=25")


def parse_prices(text: str) -> dict[str, float]:
    """'h100-sxm=2.65,cpu=0.10' -> {key: USD per GPU-hour}; keys are GPU catalog names or cpu."""
    from kvbench.specs.gpus import catalog

    return cliargs.key_numbers(text, "--price-per-hour", [*catalog(), "cpu"], unit="USD per hour", example="cpu=0.10")


# the two longest help texts, kept out of the field list
_KV_BYTES_HELP = (
    "KV-cache bytes for the servers kvbench starts (vLLM's flag). Default on CPU: 4 MiB for the built-in model; a "
    "--model is sized for --search-cap (else the concurrency) sequences of max_model_len, bounded by free memory. "
    "On GPU: vLLM's --gpu-memory-utilization rule."
)
_WORKLOAD_HELP = (
    "Traffic instead of fixed lengths: KIND:ARGS (random:, sharegpt:FILE, jsonl:FILE, shared-prefix:, multi-turn:, "
    "trace:FILE) or a NAME from --workloads / kvbench/data/workloads.toml."
)


class RunSettings(BaseModel):
    """What one `kvbench run` is asked to do. The fields with a Flag are the command's options, in --help order."""

    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not ignored

    model: Model = Field(
        None,
        description=(
            "HF id or local path (required with a GPU; CPU default: the tiny local model). With --endpoint: a local "
            "copy of the served model (tokenizer, config.json)."
        ),
    )
    kv_dtypes: parsed(list[str] | None, KvDtypes, default_from="kv_dtypes") = Field(
        None,
        description=(
            f"Comma-separated --kv-cache-dtype values (default {default_kv_dtypes()}; "
            "all: every value the installed vLLM accepts, the atlas; with --endpoint: what the server runs)."
        ),
    )
    kv_scales: Annotated[list[str] | None, Flag("--kv-scales", cli=str | None)] = Field(
        None,
        description=(
            "Scales each tensor-scaled dtype (fp8*, nvfp4*) is served with, side by side: checkpoint (the model as "
            "given: its k/v scales, else vLLM's 1.0), unit (1.0), calibrated (kvbench's, from the model's own K/V "
            "on held-out items), e.g. unit,calibrated. Default: checkpoint."
        ),
    )
    concurrency: Annotated[list[int] | None, Flag("--concurrency", cli=str | None, default_from="concurrency")] = Field(
        None, description="Fixed-concurrency phases, e.g. 16 or 8,16,32 (a sweep)."
    )
    rates: Annotated[list[float] | None, Flag("--rate", cli=str | None)] = Field(
        None,
        description="Arrival-rate phases in req/s instead, e.g. 2,4,8 (Poisson unless --burstiness; inf: all at once).",
    )
    burstiness: Annotated[float, Flag("--burstiness")] = Field(
        1.0, description="Gamma shape for --rate: 1 = Poisson, <1 burstier, >1 steadier."
    )
    # the objective's bounds; a key left out (or None) is the backend's ttft_p95_ms / tpot_p95_ms
    search_slo: Annotated[dict[str, float | None] | None, Flag("--search-slo", cli=str | None)] = Field(
        None, description="SLO for measured capacity, e.g. ttft_p95_ms=250,tpot_p95_ms=25."
    )
    no_search: Annotated[bool, Flag("--no-search")] = Field(False, description="Skip the SLO search.")
    search_cap: Annotated[int | None, Flag("--search-cap")] = Field(
        None, description="Highest concurrency the SLO search probes (default: 2x the engine's capacity)."
    )
    workload: Annotated[str | None, Flag("--workload")] = Field(None, description=_WORKLOAD_HELP)
    workloads_file: Annotated[Path | None, Flag("--workloads")] = Field(
        None, description="A TOML file of named [workloads.NAME] tables for --workload NAME."
    )
    prompt_tokens: Annotated[int | None, Flag("--prompt-tokens", default_from="prompt_tokens")] = Field(
        None, description="Prompt length in tokens (exact)."
    )
    output_tokens: Annotated[int | None, Flag("--output-tokens", default_from="output_tokens")] = Field(
        None, description="Output length in tokens (exact, ignore_eos)."
    )
    num_requests: Annotated[int | None, Flag("--num-requests", default_from="num_requests")] = Field(
        None, description="Requests per fixed-load phase."
    )
    max_model_len: Annotated[int | None, Flag("--max-model-len", default_from="max_model_len")] = Field(
        None, description="vLLM --max-model-len (default prompt + output)."
    )
    kv_cache_memory_bytes: Annotated[
        int | None, Flag("--kv-cache-memory-bytes", default_from="kv_cache_memory_bytes")
    ] = Field(None, description=_KV_BYTES_HELP)
    api: Annotated[str, Flag("--api")] = Field("completions", description="completions or chat.")
    endpoints: parsed(dict[str | None, str] | None, Endpoint) = Field(
        None,
        description=(
            "Measure running servers instead of starting vLLM: URL (one server, its dtype read from /metrics) or "
            "auto=URL1,fp8=URL2,..."
        ),
    )
    api_key: ApiKey
    headers: parsed(dict[str, str] | None, Header)
    unknown_dtypes: Annotated[str, Flag("--unknown-dtypes")] = Field(
        "error", description="'error' (exit 2) or 'record' (record them as unsupported and go on)."
    )
    results_dir: Results = Field(
        Path("results"), description="Where records go: <dir>/<machine>/runs/<run id>.json (+ .parquet samples)."
    )
    stall_timeout_s: Annotated[float | None, Flag("--stall-timeout", default_from="run.stall_timeout_s")] = Field(
        None,
        description=(
            "Seconds without any response progress before a phase is declared hung (at least 1; default 60, "
            "run_defaults.toml [run])."
        ),
    )
    startup_timeout_s: parsed(float | None, StartupTimeout, default_from="startup_timeout_s")
    realtime: Annotated[bool | None, Flag("--realtime/--no-realtime", default_from="client_realtime")] = Field(
        None, description="Run the client under SCHED_FIFO where permitted (CPU default: on)."
    )
    sweep: Annotated[bool | None, Flag("--sweep/--no-sweep", default_from="sweep")] = Field(
        None,
        description=(
            "Run the concurrency ladder 1, 2, 4, ... past the SLO knee (and the knee): the throughput vs "
            "interactivity front (default: on)."
        ),
    )
    sweep_max: Annotated[int | None, Flag("--sweep-max")] = Field(
        None, description="Highest concurrency of the ladder (default: the first power of two past the knee)."
    )
    repeat: Annotated[int | None, Flag("--repeat", default_from="repeat")] = Field(
        None,
        description=(
            "Run every fixed-load phase N times with fresh prompts: means, 95% CIs, paired differences to auto "
            "(CPU default 3, GPU 1)."
        ),
    )
    prices: Annotated[dict[str, float] | None, Flag("--price-per-hour", cli=str | None)] = Field(
        None,
        description=(
            "USD per GPU-hour (or per CPU machine-hour), e.g. h100-sxm=2.65 or cpu=0.10: USD per million tokens on "
            "the front (kvbench ships no prices)."
        ),
    )
    target_user_tps: Annotated[float | None, Flag("--target-user-tps")] = Field(
        None,
        description=(
            "Interactivity (tokens/s per user) to read throughput and cost off the front at (default: 1000 / the "
            "SLO's TPOT P95 bound)."
        ),
    )
    eval_tasks: Annotated[list[str] | None, Flag("--eval-tasks", cli=str | None, default_from="eval_tasks")] = Field(
        None,
        description=(
            "lm-eval tasks each dtype is evaluated on at rest, at load and during load (CPU default: "
            "kvbench_passkey_512; GPU: none, e.g. gsm8k with hub access)."
        ),
    )
    no_eval: Annotated[bool, Flag("--no-eval")] = Field(
        False, description="Skip the evaluation (the canaries still ride in every load phase)."
    )
    eval_limit: Annotated[int | None, Flag("--eval-limit", default_from="eval_limit")] = Field(
        None, description="First N items of each eval task (default: all; the bundled tasks have 500)."
    )
    max_eval_items: Annotated[int | None, Flag("--max-eval-items", default_from="max_eval_items")] = Field(
        None,
        description=(
            "Items until decided: where a dtype's pooled accuracy comparison at rest is undecided after "
            "--eval-limit items of each kvbench task, evaluate more in stages (at most 4 looks, O'Brien-Fleming "
            "alpha spending) up to this many per task (CPU default: 500 unless --eval-limit is given; lm-eval's tasks "
            "use their own size)."
        ),
    )
    accuracy_budget_points: Annotated[
        float | None, Flag("--accuracy-budget", default_from="accuracy_budget_points")
    ] = Field(None, description="Most accuracy points a dtype may lose vs auto and still be recommended (default 1).")
    accuracy_confidence: Annotated[
        float | None, Flag("--accuracy-confidence", default_from="run.accuracy_confidence")
    ] = Field(
        None,
        description=(
            "Confidence of the one-sided non-inferiority bound that must stay inside the budget (default 0.95, "
            "run_defaults.toml [run]; Tango's score test, Holm over tasks x conditions)."
        ),
    )
    strict: Annotated[bool, Flag("--strict")] = Field(
        False, description="Exit 1 if any dtype failed (default: only if none succeeded)."
    )
    as_json: AsJson = Field(
        False,
        description="Print the record's headline numbers as one JSON document on stdout (progress goes to stderr).",
    )

    # -- not flags: vLLM's own arguments (after -- on the command line) and the machine the run is for --------
    extra_args: list[str] | None = None
    on_gpu: bool = False
    defaults: dict = Field(default_factory=dict)  # the backend's run_defaults.toml section
    python: str = sys.executable
    machine: str | None = None

    @classmethod
    def for_machine(cls, on_gpu: bool, **values) -> RunSettings:
        """The settings of a run on this backend: its run_defaults.toml section (unless `defaults` is given)."""
        values.setdefault("defaults", load_toml("run_defaults.toml")["gpu" if on_gpu else "cpu"])
        return cls(on_gpu=on_gpu, **values)

    def or_default(self, name: str):
        """The field's value, or where it was not given the run_defaults.toml value its Flag names (None if none)."""
        value = getattr(self, name)
        source = flag_of(type(self), name)
        if value is not None or source is None or source.default_from is None:
            return value
        section, _, key = source.default_from.rpartition(".")
        table = load_toml("run_defaults.toml")[section] if section else self.defaults
        return table.get(key)

    def request_headers(self) -> dict[str, str]:
        """--header values, and the bearer key as Authorization unless a header already sets it, checked
        (harness/server/endpoint.py request_headers)."""
        from kvbench.harness.server.endpoint import request_headers

        return request_headers(self.headers, self.api_key, self.endpoints is not None)

    # -- checks, one per field: the command line's text is parsed here too -----------------------------------
    @field_validator("kv_dtypes", mode="before")
    @classmethod
    def _kv_dtypes(cls, value):
        if isinstance(value, str):
            value = cliargs.names(value, "--kv-dtypes", "auto,fp8,nvfp4")
        if value is not None:
            value = list(dict.fromkeys(value))
            if not value:
                raise UsageError("--kv-dtypes is empty; give e.g. auto,fp8,nvfp4")
            if ALL_DTYPES in value and len(value) > 1:
                raise UsageError(f"--kv-dtypes {ALL_DTYPES} is every dtype the installed vLLM accepts: give it alone")
        return value

    @field_validator("kv_scales", mode="before")
    @classmethod
    def _kv_scales(cls, value):
        from kvbench.core.kvscales import VARIANTS

        if isinstance(value, str):
            return cliargs.choices(value, "--kv-scales", VARIANTS, "--kv-scales variant") if value else None
        if value is not None:
            value = list(dict.fromkeys(value))
            for v in value:
                cliargs.choice(v, "--kv-scales", VARIANTS)
        return value

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency(cls, value):
        if isinstance(value, str):
            return cliargs.int_list(value, "--concurrency") if value else None
        for c in value or []:
            cliargs.at_least_one(c, "--concurrency")
        return value

    @field_validator("rates", mode="before")
    @classmethod
    def _rates(cls, value):
        if isinstance(value, str):
            return cliargs.float_list(value, "--rate", allow_inf=True) if value else None
        for r in value or []:
            cliargs.number(r, "--rate", low=0, low_open=True, allow_inf=True, unit="req/s")
        return value

    @field_validator("search_slo", mode="before")
    @classmethod
    def _search_slo(cls, value):
        if isinstance(value, str):
            return parse_slo(value)
        for key, bound in (value or {}).items():
            cliargs.positive(bound, f"--search-slo {key}", "ms")
        return value

    @field_validator("prices", mode="before")
    @classmethod
    def _prices(cls, value):
        if isinstance(value, str):
            return parse_prices(value) if value else None
        for key, price in (value or {}).items():
            cliargs.number(price, f"--price-per-hour {key}", low=0, unit="USD per GPU-hour")
        return value

    @field_validator("eval_tasks", mode="before")
    @classmethod
    def _eval_tasks(cls, value):
        if isinstance(value, str):
            return cliargs.names(value, "--eval-tasks", "kvbench_passkey_512") if value else None
        return value

    @field_validator("endpoints", mode="before")
    @classmethod
    def _endpoints(cls, value):
        from kvbench.harness.server.endpoint import parse_endpoints

        return parse_endpoints(value) if isinstance(value, str) else value

    @field_validator("headers", mode="before")
    @classmethod
    def _headers(cls, value):
        from kvbench.harness.server.endpoint import parse_headers

        return parse_headers(value) if isinstance(value, list | tuple) else value

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value):
        from kvbench.harness.server.endpoint import check_api_key

        return None if value is None else check_api_key(value)

    @field_validator("api")
    @classmethod
    def _api(cls, value):
        return cliargs.choice(value, "--api", APIS)

    @field_validator("unknown_dtypes")
    @classmethod
    def _unknown_dtypes(cls, value):
        return cliargs.choice(value, "--unknown-dtypes", UNKNOWN_DTYPES)

    @field_validator(
        "prompt_tokens",
        "output_tokens",
        "num_requests",
        "max_model_len",
        "search_cap",
        "sweep_max",
        "repeat",
        "eval_limit",
        "max_eval_items",
    )
    @classmethod
    def _whole(cls, value, info):
        return cliargs.at_least_one(value, flag_of(cls, info.field_name).names[0])

    @field_validator("max_eval_items")
    @classmethod
    def _max_items(cls, value):
        from kvbench.specs.evaltasks import DEFAULT_ITEMS

        if value is not None and value > DEFAULT_ITEMS:  # N-P14: a look past the task's items breaks lm-eval
            raise UsageError(
                f"--max-eval-items must be at most {DEFAULT_ITEMS}, the items each kvbench task has; got {value:,}"
            )
        return value

    @field_validator("stall_timeout_s")
    @classmethod
    def _stall(cls, value):
        return cliargs.number(value, "--stall-timeout", low=1, unit="s")  # below 1 s a healthy prefill is a "hang"

    @field_validator("burstiness")
    @classmethod
    def _burstiness(cls, value):
        return cliargs.positive(value, "--burstiness")

    @field_validator("target_user_tps")
    @classmethod
    def _target(cls, value):
        return cliargs.positive(value, "--target-user-tps", "tokens/s per user")

    @field_validator("accuracy_budget_points")
    @classmethod
    def _budget(cls, value):
        return cliargs.number(value, "--accuracy-budget", low=0, high=100, unit="points")

    @field_validator("accuracy_confidence")
    @classmethod
    def _confidence(cls, value):
        # a one-sided bound at 50% or less is no bound; at 1 it is infinitely wide
        return cliargs.number(value, "--accuracy-confidence", low=0.5, high=0.9999, low_open=True)

    @field_validator("kv_cache_memory_bytes")
    @classmethod
    def _kv_bytes(cls, value):
        if value is not None:
            from kvbench.harness.server.kvbudget import parse_bytes

            parse_bytes(value)
        return value

    @model_validator(mode="after")
    def _together(self) -> RunSettings:
        """The checks that take two settings."""
        if self.concurrency and self.rates:
            raise UsageError("give either --concurrency or --rate, not both")
        if self.eval_tasks and not self.no_eval:  # a typo is refused before the model is built or a server starts
            from kvbench.specs.evaltasks import check_task_names

            check_task_names(self.eval_tasks)
        self.request_headers()  # only with --endpoint, and only credentials that can be scrubbed
        if self.kv_cache_memory_bytes is not None:
            if self.endpoints is not None:
                raise UsageError("--kv-cache-memory-bytes sizes a server kvbench starts; drop it with --endpoint")
            if any(a.startswith("--kv-cache-memory") for a in self.extra_args or []):
                raise UsageError("give --kv-cache-memory-bytes once: as kvbench's flag or after --, not both")
        if self.endpoints is not None and self.kv_dtypes == [ALL_DTYPES]:
            raise UsageError("--kv-dtypes all starts a server per dtype; with --endpoint name what each server runs")
        if self.endpoints is not None and self.kv_scales and self.kv_scales != ["checkpoint"]:
            raise UsageError(
                "--kv-scales unit/calibrated serves copies of the model that kvbench starts; drop it with --endpoint"
            )
        if self.endpoints is not None and self.extra_args:
            raise UsageError(
                f"vLLM arguments after -- ({' '.join(self.extra_args)}) apply only when kvbench starts the server; "
                "drop them with --endpoint"
            )
        return self
