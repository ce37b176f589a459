"""The `--workload` shorthand: `KIND:ARGS` for one-off workloads, or a NAME from a workloads TOML file.

    fixed:prompt=384,output=128[,requests=64]
    random:input=384,output=128[,range=0.5][,dist=uniform|normal|lognormal][,cv=0.3][,sigma=0.8][,requests=N]
        uniform: vLLM's --random-range-ratio (range); normal: std = cv x mean; lognormal: mean and sigma
    sharegpt:FILE[,requests=N][,output=N]          (output: vLLM's --sharegpt-output-len)
    jsonl:FILE[,requests=N][,output=N]
    shared-prefix:groups=8,prefix=256,suffix=64,output=32[,requests=64]
    multi-turn:sessions=8,turns=4,user=64,reply=32[,think=0.5][,concurrent=4]   (turns=2-6: a range)
    trace:FILE[,time_scale=0.5][,block=512][,requests=N][,max_span=SECONDS]

A FILE may contain commas: only trailing `key=value` parts are options. Anything without a known `KIND:`
prefix is a workload name, looked up in --workloads FILE first, then in kvbench/data/workloads.toml.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from kvbench.core.datafiles import data_path
from kvbench.core.errors import UsageError
from kvbench.harness.workloads.spec import KINDS, parse_spec

SHIPPED = "workloads.toml"
FORMS = {
    "fixed": "fixed:prompt=N,output=N[,requests=N]",
    "random": "random:input=N,output=N[,range=R][,dist=uniform|normal|lognormal][,cv=C][,sigma=S][,requests=N]",
    "sharegpt": "sharegpt:FILE[,requests=N][,output=N]",
    "jsonl": "jsonl:FILE[,requests=N][,output=N]",
    "shared-prefix": "shared-prefix:groups=N,prefix=N,suffix=N,output=N[,requests=N]",
    "multi-turn": "multi-turn:sessions=N,turns=N|A-B,user=N,reply=N[,think=SECONDS][,concurrent=N]",
    "trace": "trace:FILE[,time_scale=X][,block=N][,requests=N][,max_span=SECONDS]",
}
# shorthand key -> spec key, per kind (random's lengths are assembled below).
_KEYS = {
    "fixed": {"prompt": "prompt_tokens", "output": "output_tokens", "requests": "num_requests"},
    "random": {
        "input": None,
        "output": None,
        "range": None,
        "dist": None,
        "cv": None,
        "sigma": None,
        "requests": "num_requests",
    },
    "sharegpt": {"requests": "num_requests", "output": "output_tokens"},
    "jsonl": {"requests": "num_requests", "output": "output_tokens"},
    "shared-prefix": {
        "groups": "groups",
        "prefix": "prefix_tokens",
        "suffix": "suffix_tokens",
        "output": "output_tokens",
        "requests": "num_requests",
    },
    "multi-turn": {
        "sessions": "sessions",
        "turns": "turns",
        "user": "user_tokens",
        "reply": "reply_tokens",
        "think": "think_time_s",
        "concurrent": "max_concurrent_sessions",
    },
    "trace": {
        "time_scale": "time_scale",
        "block": "block_tokens",
        "requests": "num_requests",
        "max_span": "max_span_s",
    },
}
_FLOAT_KEYS = {"range", "cv", "sigma", "think", "time_scale"}
_OPTION = re.compile(r"^\s*[A-Za-z_]+\s*=")


def parse_workload(text: str, *, workloads_file: str | Path | None = None):
    """`--workload TEXT` -> a validated spec (its `name` set for named workloads)."""
    text = (text or "").strip()
    kind, sep, rest = text.partition(":")
    if sep and kind in KINDS:
        return parse_shorthand(kind, rest)
    return named_workload(text, workloads_file=workloads_file)


def parse_shorthand(kind: str, rest: str):
    where = f"--workload {kind}:{rest}"
    parts = rest.split(",") if rest else []
    options: list[str] = []
    if kind in ("sharegpt", "jsonl", "trace"):
        # The file comes first; it may itself contain commas, so options are only the trailing key=value parts.
        while parts and _OPTION.match(parts[-1]) and len(parts) > 1:
            options.insert(0, parts.pop())
        path = ",".join(parts).strip()
        if not path:
            raise UsageError(f"{where}: name a file, e.g. {FORMS[kind]}")
        table: dict[str, Any] = {"kind": kind, "path": path}
    else:
        options, table = parts, {"kind": kind}
    values = _options(options, kind, where)
    if kind == "random":
        table.update(_random_lengths(values, where))
        if "requests" in values:
            table["num_requests"] = values["requests"]
    else:
        for key, value in values.items():
            table[_KEYS[kind][key]] = value
        if kind == "multi-turn" and isinstance(table.get("turns"), str):
            table["turns"] = _turn_range(table["turns"], where)
    return parse_spec(table, where, base_dir=Path.cwd())


def _options(parts: list[str], kind: str, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        if not part.strip():
            continue
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in _KEYS[kind]:
            raise UsageError(f"{where}: {part.strip()!r} is not an option of {kind}; the form is {FORMS[kind]}")
        if key in out:
            raise UsageError(f"{where}: {key} is given twice")
        out[key] = _value(key, value, kind, where)
    return out


def _value(key: str, value: str, kind: str, where: str) -> Any:
    if key == "dist":
        return value
    if key == "turns" and re.fullmatch(r"\d+\s*-\s*\d+", value):
        return value
    try:
        number = float(value) if key in _FLOAT_KEYS else int(value)
    except ValueError:
        what = "a number" if key in _FLOAT_KEYS else "a whole number"
        extra = " or a range A-B" if key == "turns" else ""
        raise UsageError(f"{where}: {key} must be {what}{extra}, got {value!r}") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise UsageError(f"{where}: {key} must be a finite number, got {value!r}")
    return number


def _turn_range(text: str, where: str) -> dict[str, int]:
    lo, _, hi = text.partition("-")
    return {"min": int(lo), "max": int(hi)}


def _random_lengths(values: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("input", "output"):
        if key not in values:
            raise UsageError(f"{where}: {key} is required; the form is {FORMS['random']}")
    dist = values.get("dist", "uniform")
    needs = {"uniform": set(), "normal": {"cv"}, "lognormal": {"sigma"}}
    allowed = {"uniform": {"range"}, "normal": {"cv"}, "lognormal": {"sigma"}}
    if dist not in needs:
        raise UsageError(
            f"{where}: unknown dist {dist!r}; choose from: uniform, normal, lognormal "
            "(a histogram: write the workload in a TOML file)"
        )
    extra = {"range", "cv", "sigma"} & set(values) - allowed[dist]
    if extra:
        raise UsageError(
            f"{where}: {', '.join(sorted(extra))} does not apply to dist={dist}; the form is {FORMS['random']}"
        )
    missing = needs[dist] - set(values)
    if missing:
        raise UsageError(f"{where}: dist={dist} needs {', '.join(sorted(missing))}; the form is {FORMS['random']}")

    def one(mean: int) -> dict[str, Any]:
        if dist == "uniform":
            return {"dist": "uniform", "mean": mean, "range_ratio": values.get("range", 0.0)}
        if dist == "normal":
            return {"dist": "normal", "mean": float(mean), "std": values["cv"] * mean}
        return {"dist": "lognormal", "mean": float(mean), "sigma": values["sigma"]}

    return {"prompt": one(values["input"]), "output": one(values["output"])}


# --- named workloads ---------------------------------------------------------------------------------


def load_workloads(path: str | Path | None = None) -> dict[str, Any]:
    """Every `[workloads.NAME]` table of a TOML file (the shipped one when path is None), validated."""
    import tomllib

    file = Path(path).expanduser() if path is not None else data_path(SHIPPED)
    form = "a TOML file of [workloads.NAME] tables"
    try:
        if file.exists() and not file.is_file():  # a folder, a device, a pipe: never read (or waited on)
            raise UsageError(f"--workloads {file}: not a file ({form})")
        with open(file, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise UsageError(f"--workloads {file}: no such file ({form})") from None
    except UnicodeDecodeError:
        raise UsageError(f"--workloads {file}: not UTF-8 text ({form})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{file}: not valid TOML ({' '.join(str(exc).split())})") from None
    except OSError as exc:
        raise UsageError(f"--workloads {file}: cannot read ({exc.strerror or exc})") from None
    unknown = set(data) - {"workloads"}
    if unknown:
        raise UsageError(
            f"{file}: unknown top-level key(s) {', '.join(sorted(unknown))}; "
            "the file holds [workloads.NAME] tables only"
        )
    tables = data.get("workloads", {})
    if not isinstance(tables, dict) or not tables:
        raise UsageError(f"{file}: no [workloads.NAME] tables")
    out = {}
    for name, table in tables.items():
        spec = parse_spec(table, f"workload {name!r} in {file}", base_dir=file.parent)
        out[name] = spec.model_copy(update={"name": name})
    return out


def named_workload(name: str, *, workloads_file: str | Path | None = None):
    catalogs = ([load_workloads(workloads_file)] if workloads_file is not None else []) + [load_workloads()]
    for catalog in catalogs:
        if name in catalog:
            return catalog[name]
    names = sorted({n for c in catalogs for n in c})
    raise UsageError(
        f"unknown workload {name!r}; choose from: {', '.join(names)}; or give KIND:ARGS, e.g. {FORMS['shared-prefix']}"
    )
