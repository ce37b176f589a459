"""Workload specs: one strict pydantic model per kind, validated from a TOML table or the CLI shorthand.

Kinds (the `kind` key; a table without one is `fixed`, today's shape):

- `fixed`: prompt_tokens, output_tokens (exact, every request) — maps to kvbench.harness.client.workload.Workload.
- `random`: `prompt` and `output` lengths drawn per request (see lengths.py: uniform as vLLM's
  --random-range-ratio, normal, lognormal, histogram), clipped to [min, max] and to max_model_len.
- `sharegpt`: a ShareGPT JSON file read exactly as `vllm bench serve --dataset-name sharegpt` reads it.
- `jsonl`: one request per line, `{"prompt": text, "output_tokens": n}` (vLLM's custom format) or
  `{"prompt_tokens": n, "output_tokens": n}`.
- `shared-prefix`: `groups` prefixes of `prefix_tokens`, each request one of them plus its own
  `suffix_tokens`, shuffled (vLLM's prefix_repetition shape).
- `multi-turn`: `sessions` conversations of `turns` turns; each turn resends the conversation so far plus a new
  user message of `user_tokens`, asks for `reply_tokens`, after `think_time_s`; at most
  `max_concurrent_sessions` at once.
- `trace`: a Mooncake-style JSONL trace (timestamp ms, input_length, output_length, hash_ids) replayed at
  timestamp x `time_scale`, each hash id a block of `block_tokens` tokens (Mooncake: 512).

`num_requests` is optional where the data has a natural count (dataset files: what they hold; traces: every
record); the run's --num-requests (build's `num_requests`) overrides it.

Every mistake is one line naming the workload, the key and the valid form (`explain`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError, model_validator

from kvbench.core.errors import UsageError
from kvbench.harness.client.workload import Workload
from kvbench.harness.workloads.lengths import LENGTH_FORM, THINK_FORM, Length, Strict, ThinkTime

KINDS = ("fixed", "random", "sharegpt", "jsonl", "shared-prefix", "multi-turn", "trace")

# vLLM's ShareGPT filter defaults (vllm/benchmarks/datasets/datasets.py is_valid_sequence).
VLLM_MIN_LEN, VLLM_MAX_PROMPT_LEN, VLLM_MAX_TOTAL_LEN = 4, 1024, 2048
# Mooncake's trace: every hash id stands for one 512-token block (see trace.py for the sources).
MOONCAKE_BLOCK_TOKENS = 512
# What one run may ask for before it is refused: a replay longer than MAX_SPAN_S unless the spec raises it
# (a timestamp of 1e12 ms waits 31 years in silence), and conversations whose requests are held in memory.
MAX_SPAN_S = 3600.0
MAX_SESSIONS = 10_000
MAX_TURN_REQUESTS = 100_000  # sessions x the most turns a session may have


def _count(desc: str = "a whole number >= 1", default: Any = ..., ge: int = 1):
    return Field(default, ge=ge, description=desc)


class _Spec(Strict):
    name: str | None = Field(None, description="a name (set from the [workloads.NAME] table)", exclude=True)

    @property
    def label(self) -> str:
        """What a table or page title calls this workload: its name, or the shorthand that makes it."""
        return self.name or shorthand_of(self)

    def describe(self) -> dict[str, Any]:
        """The parameters for a run record (JSON-ready)."""
        return {"name": self.label, **self.model_dump(mode="json", exclude_none=True)}


class FixedSpec(_Spec):
    kind: Literal["fixed"] = "fixed"
    prompt_tokens: int = _count()
    output_tokens: int = _count()
    num_requests: int | None = _count(default=None)

    def to_workload(self, *, num_requests: int, api: str = "completions", seed: int = 0) -> Workload:
        return Workload(self.prompt_tokens, self.output_tokens, num_requests, api=api, seed=seed)

    @classmethod
    def from_workload(cls, w: Workload) -> FixedSpec:
        return cls(prompt_tokens=w.prompt_tokens, output_tokens=w.output_tokens, num_requests=w.num_requests)


class RandomSpec(_Spec):
    kind: Literal["random"]
    prompt: Length = Field(description=LENGTH_FORM)
    output: Length = Field(description=LENGTH_FORM)
    num_requests: int | None = _count(default=None)


class ShareGPTSpec(_Spec):
    kind: Literal["sharegpt"]
    path: str = Field(min_length=1, description="the path of a ShareGPT JSON file")
    num_requests: int | None = _count(default=None)
    # vLLM's --sharegpt-output-len: every request asks for this many tokens (the length filter then skips
    # only the min-output check, as vLLM does).
    output_tokens: int | None = _count(default=None)
    min_tokens: int = _count("a whole number >= 1 (vLLM: 4)", default=VLLM_MIN_LEN)
    max_prompt_tokens: int = _count("a whole number >= 1 (vLLM: 1024)", default=VLLM_MAX_PROMPT_LEN)
    max_total_tokens: int = _count("a whole number >= 1 (vLLM: 2048)", default=VLLM_MAX_TOTAL_LEN)
    oversample: bool = Field(True, description="true or false (vLLM oversamples unless --no-oversample)")
    shuffle: bool = Field(True, description="true or false (vLLM shuffles unless --disable-shuffle)")


class JsonlSpec(_Spec):
    kind: Literal["jsonl"]
    path: str = Field(min_length=1, description="the path of a JSONL file")
    num_requests: int | None = _count(default=None)
    output_tokens: int | None = _count(default=None)
    shuffle: bool = Field(True, description="true or false")


class SharedPrefixSpec(_Spec):
    kind: Literal["shared-prefix"]
    groups: int = _count("a whole number >= 1 (distinct prefixes)")
    prefix_tokens: int = _count()
    suffix_tokens: int = _count("a whole number >= 0", ge=0)
    output_tokens: int = _count()
    num_requests: int | None = _count(default=None)
    shuffle: bool = Field(True, description="true or false")

    @model_validator(mode="after")
    def _enough(self):
        if self.num_requests is not None and self.num_requests < self.groups:
            raise ValueError(
                f"num_requests ({self.num_requests}) must be >= groups ({self.groups}): every group needs a request"
            )
        return self


class TurnRange(Strict):
    min: int = _count()
    max: int = _count()

    @model_validator(mode="after")
    def _order(self):
        if self.max < self.min:
            raise ValueError(f"turns max ({self.max}) must be >= min ({self.min})")
        return self


def _int_turns(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return {"min": value, "max": value}
    return value


Turns = Annotated[TurnRange, BeforeValidator(_int_turns)]


class MultiTurnSpec(_Spec):
    kind: Literal["multi-turn"]
    sessions: int = Field(ge=1, le=MAX_SESSIONS, description=f"a whole number from 1 to {MAX_SESSIONS:,}")
    turns: Turns = Field(description="a whole number >= 1, or a table {min, max} (drawn uniformly per session)")
    user_tokens: Length = Field(description=LENGTH_FORM)
    reply_tokens: Length = Field(description=LENGTH_FORM)
    think_time_s: ThinkTime = Field(0.0, validate_default=True, description=THINK_FORM)
    max_concurrent_sessions: int | None = _count(default=None)

    @model_validator(mode="after")
    def _bounded(self):
        if self.sessions * self.turns.max > MAX_TURN_REQUESTS:
            raise ValueError(
                f"sessions x turns = {self.sessions:,} x {self.turns.max:,} requests is more than one run holds "
                f"({MAX_TURN_REQUESTS:,}); lower sessions or turns"
            )
        return self

    @property
    def concurrent(self) -> int:
        return min(self.sessions, self.max_concurrent_sessions or self.sessions)


class TraceSpec(_Spec):
    kind: Literal["trace"]
    path: str = Field(min_length=1, description="the path of a Mooncake-style JSONL trace")
    time_scale: float = Field(1.0, gt=0, le=1000, description="a number > 0 and <= 1000 (0.5 replays twice as fast)")
    block_tokens: int = _count("a whole number >= 1 (tokens per hash id; Mooncake: 512)", default=MOONCAKE_BLOCK_TOKENS)
    num_requests: int | None = _count(default=None)
    max_span_s: float = Field(
        MAX_SPAN_S, gt=0, allow_inf_nan=False, description="seconds > 0: the longest replay kvbench starts (1 hour)"
    )


WorkloadSpec = Annotated[
    FixedSpec | RandomSpec | ShareGPTSpec | JsonlSpec | SharedPrefixSpec | MultiTurnSpec | TraceSpec,
    Field(discriminator="kind"),
]
_ADAPTER = TypeAdapter(WorkloadSpec)
_BY_KIND = {
    "fixed": FixedSpec,
    "random": RandomSpec,
    "sharegpt": ShareGPTSpec,
    "jsonl": JsonlSpec,
    "shared-prefix": SharedPrefixSpec,
    "multi-turn": MultiTurnSpec,
    "trace": TraceSpec,
}
PATH_KINDS = ("sharegpt", "jsonl", "trace")


def parse_spec(table: dict[str, Any], where: str, base_dir: Path | None = None):
    """A validated spec from one table (`where` names it in errors, e.g. "workload 'chat' in FILE").

    A relative `path` is taken relative to `base_dir` (the TOML file's folder), and the file must exist.
    """
    if not isinstance(table, dict):
        raise UsageError(f"{where} must be a table of keys (kind = ..., ...), got {type(table).__name__}")
    data = {"kind": "fixed", **table}
    kind = data["kind"]
    if kind not in _BY_KIND:
        raise UsageError(f"{where}: unknown kind {kind!r}; choose from: {', '.join(KINDS)}")
    if "name" in table:
        raise UsageError(f"{where}: 'name' is not a key; the table's own name is the workload's name")
    try:
        spec = _ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise UsageError(explain(exc, where, _BY_KIND[kind])) from None
    if kind in PATH_KINDS:
        path = Path(spec.path).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            what = "is not a regular file (a device, a pipe or a folder)" if path.exists() else "not found"
            raise UsageError(
                f"{where}: {kind} file {str(path)!r} {what} (path = a file kvbench can read; "
                "nothing is downloaded at run time)"
            )
        spec = spec.model_copy(update={"path": str(path)})
    return spec


def explain(exc: ValidationError, where: str, model: type | None = None) -> str:
    """The first validation error as one line: the key, what it must be, what was given."""
    err = exc.errors(include_url=False)[0]
    keys, field_model = _walk(err["loc"], model)
    key = ".".join(keys)
    kind, given = err["type"], err.get("input")
    form = _description(field_model, keys[-1].split("[")[0]) if keys else ""
    if kind == "extra_forbidden":
        valid = ", ".join(k for k in (field_model.model_fields if field_model else {}) if k not in ("name", "dist"))
        return f"{where}: unknown key {key!r}" + (f"; valid keys: {valid}" if valid else "")
    if kind == "missing":
        return f"{where}: {key} is required" + (f" ({form})" if form else "")
    ctx = err.get("ctx") or {}
    if kind == "union_tag_invalid":
        return f"{where}: {key} has an unknown dist {ctx.get('tag')!r}; choose from: {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return f"{where}: {key} needs a dist key" + (f" ({form})" if form else "")
    if kind == "value_error":
        return f"{where}: " + (f"{key}: " if key else "") + err["msg"].removeprefix("Value error, ")
    shown = repr(given) if not isinstance(given, (dict, list)) else type(given).__name__
    return f"{where}: {key or 'the table'} must be {form or err['msg'].lower()}, got {shown}"


def _nested() -> dict[str, dict[str, type]]:
    from kvbench.harness.workloads import lengths as L

    length = {
        "fixed": L.Fixed,
        "uniform": L.Uniform,
        "normal": L.Normal,
        "lognormal": L.LogNormal,
        "histogram": L.Histogram,
    }
    think = {"constant": L.ConstantThink, "exponential": L.ExponentialThink, "uniform": L.UniformThink}
    return {
        "prompt": length,
        "output": length,
        "user_tokens": length,
        "reply_tokens": length,
        "think_time_s": think,
        "turns": {"": TurnRange},
    }


def _walk(loc: tuple, model: type | None) -> tuple[list[str], type | None]:
    """The keys of an error location (union tags and validator names dropped), and the model holding the last."""
    nested, keys, group, current, parts = _nested(), [], None, model, list(loc)
    if parts and parts[0] in KINDS:
        parts = parts[1:]  # the top-level union's tag
    for part in parts:
        if isinstance(part, int):
            if keys:
                keys[-1] += f"[{part}]"
            continue
        part = str(part)
        if part.startswith("function-"):
            continue
        if group is not None and part in group:
            current, group = group[part], None
            continue
        if group is not None and "" in group:  # a nested table without a tag (turns)
            current, group = group[""], None
        keys.append(part)
        if current is not None and part in current.model_fields and part in nested:
            group = nested[part]
    return keys, current


def _description(model: type | None, key: str) -> str:
    field = model.model_fields.get(key) if model is not None else None
    return (field.description or "") if field is not None else ""


def shorthand_of(spec) -> str:
    """The CLI shorthand that makes this spec where there is one, else kind + its parameters."""
    return to_shorthand(spec)


# --- back to a label (here, not in shorthand.py: shorthand parses into specs, so it imports this module) ---


def to_shorthand(spec) -> str:
    """The shorthand that makes `spec`, or `kind(key=value, ...)` where the shorthand cannot say it."""
    k = spec.kind
    if k == "fixed":
        return _join(
            k, [("prompt", spec.prompt_tokens), ("output", spec.output_tokens), ("requests", spec.num_requests)]
        )
    if k in ("sharegpt", "jsonl"):
        return _join(k, [("", Path(spec.path).name), ("requests", spec.num_requests), ("output", spec.output_tokens)])
    if k == "trace":
        # Labels name the file, not where it lives (describe() keeps the full path).
        return _join(
            k,
            [
                ("", Path(spec.path).name),
                ("time_scale", spec.time_scale if spec.time_scale != 1 else None),
                ("block", spec.block_tokens if spec.block_tokens != 512 else None),
                ("requests", spec.num_requests),
                ("max_span", f"{spec.max_span_s:g}" if spec.max_span_s != MAX_SPAN_S else None),
            ],
        )
    if k == "shared-prefix":
        return _join(
            k,
            [
                ("groups", spec.groups),
                ("prefix", spec.prefix_tokens),
                ("suffix", spec.suffix_tokens),
                ("output", spec.output_tokens),
                ("requests", spec.num_requests),
            ],
        )
    if k == "multi-turn":
        t = spec.turns
        turns = t.min if t.min == t.max else f"{t.min}-{t.max}"
        think = spec.think_time_s
        simple = [
            ("sessions", spec.sessions),
            ("turns", turns),
            ("user", _len(spec.user_tokens)),
            ("reply", _len(spec.reply_tokens)),
            ("think", f"{think.seconds:g}" if think.dist == "constant" else f"{think.dist}"),
            ("concurrent", spec.max_concurrent_sessions),
        ]
        return _join(k, simple)
    p, o = spec.prompt, spec.output
    if p.dist == o.dist == "uniform" and p.range_ratio == o.range_ratio:
        return _join(
            k, [("input", p.mean), ("output", o.mean), ("range", f"{p.range_ratio:g}"), ("requests", spec.num_requests)]
        )
    return _join(k, [("input", _len(p)), ("output", _len(o)), ("requests", spec.num_requests)])


def _len(length) -> str:
    if length.dist == "fixed":
        return str(length.value)
    if length.dist == "uniform":
        return f"uniform({length.mean}±{length.range_ratio:g})"
    if length.dist == "normal":
        return f"normal({length.mean:g},{length.std:g})"
    if length.dist == "lognormal":
        return (
            f"lognormal(median={length.median:g},p90={length.p90:g})"
            if length.median is not None
            else f"lognormal(mean={length.mean:g},sigma={length.sigma:g})"
        )
    return f"histogram({len(length.weights)} bins)"


def _join(kind: str, items: list[tuple[str, Any]]) -> str:
    parts = [str(v) if not k else f"{k}={v}" for k, v in items if v is not None]
    return f"{kind}:{','.join(parts)}"
