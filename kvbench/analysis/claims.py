"""Release claims as data, re-derived from kvbench's specs, each with a verdict and the reason.

A claims file is TOML (see kvbench/data/claims/nvfp4-kv-cache-article.toml for the schema).
Measured values, when a kvbench run supplies them, sit beside the derived ones.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from kvbench.analysis import claims_accuracy
from kvbench.analysis.claims_accuracy import measured_where as _measured_where
from kvbench.analysis.claims_accuracy import newest_first as _newest_first
from kvbench.core.datafiles import data_path
from kvbench.core.errors import UsageError, unknown_choice
from kvbench.core.units import GB
from kvbench.specs.capacity import (
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    budget_from_bytes,
    budget_from_gpu,
    capacity_row,
)
from kvbench.specs.formats import format_ratio, get_format
from kvbench.specs.gpus import get_gpu
from kvbench.specs.models import load_model

DEFAULT_CLAIMS = "claims/nvfp4-kv-cache-article.toml"
QUANTITIES = (
    "bytes_per_element",
    "bytes_ratio",
    "kv_budget_gb",
    "kv_per_user_gb",
    "users",
    "users_ratio",
    "gpus_needed",
    "accuracy_loss_points",
    "ttft_speedup",
    "external",
)
UNITS = {
    "bytes_per_element": "B/elem",
    "bytes_ratio": "x",
    "kv_budget_gb": "GB",
    "kv_per_user_gb": "GB",
    "users": "users",
    "users_ratio": "x",
    "gpus_needed": "GPUs",
    "accuracy_loss_points": "points",
    "ttft_speedup": "x",
    "external": "",
}
# Which runs may supply a claim's measured value: only runs of the claim's model (at its context and budget), or
# runs of any model, for claims about the format itself (a capacity ratio, an accuracy loss "across benchmarks");
# the value then names the model and run it came from.
MEASURED_ON = ("claim-model", "any-model")
# Workloads whose requests share prefixes, so vLLM's prefix cache can hit (harness/client/workload.py kinds).
PREFIX_SHARING_WORKLOADS = ("shared-prefix", "multi-turn", "trace")


@dataclass(frozen=True)
class Verdict:
    id: str
    text: str
    where: str
    quantity: str
    unit: str
    claimed: float | str
    derived: float | None
    derivation: str
    verdict: str  # "holds", "off", "fails", "not checkable", "not decided" (an accuracy claim's undecided verdict)
    delta_pct: float | None
    measured: float | None = None
    measure: str | None = None
    source: str | None = None  # where this claim comes from, when not the file's own source
    detail: str | None = None  # the label where the verdict word alone says too little ("not decided (...)")

    @property
    def label(self) -> str:
        if self.detail:
            return self.detail
        if self.verdict == "off":
            return f"off by {self.delta_pct:+.1f}%"
        if self.verdict == "fails" and self.delta_pct is not None:
            return f"fails ({self.delta_pct:+.1f}%)"
        return self.verdict


@dataclass(frozen=True)
class Source:
    """Where a claims file's claims come from: a publication named by title, publisher and date, with an
    http(s) URL and/or a file beside the claims file (never a path outside the claims folder: the dashboard
    copies it into a published site)."""

    title: str | None = None
    publisher: str | None = None
    date: str | None = None
    url: str | None = None
    file: Path | None = None

    def describe(self) -> str:
        named = ", ".join(x for x in (self.title, self.publisher, self.date) if x)
        where = self.url or (self.file.name if self.file else None)
        return f"{named} ({where})" if named and where else (named or where or "no source given")

    def as_dict(self) -> dict:
        return {
            "title": self.title,
            "publisher": self.publisher,
            "date": self.date,
            "url": self.url,
            "file": self.file.name if self.file else None,
        }


def _url(value, file: Path) -> str:
    if not isinstance(value, str) or urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc:
        raise UsageError(
            f"{file}: source url {str(value)[:80]!r} is not an http(s) URL; give https://... or a file in {file.parent}"
        )
    return value


def _inside(value, file: Path) -> Path:
    folder = file.parent.resolve()
    if not isinstance(value, str) or not value or Path(value).is_absolute():
        raise UsageError(f"{file}: source file {str(value)[:80]!r} must be a relative path to a file inside {folder}")
    path = (folder / value).resolve()
    if not path.is_relative_to(folder) or not path.is_file():
        raise UsageError(
            f"{file}: source file {value!r} is not a file inside {folder} (the claims folder); "
            "give an http(s) URL or a file beside the claims file"
        )
    return path


def parse_source(raw, file: Path) -> Source:
    """`source = "https://..."`, `source = "file-beside-me.txt"`, or a [source] table with title, publisher,
    date and optionally url and file. Anything else (javascript:, a path outside the claims folder) is refused."""
    if raw is None:
        return Source()
    if isinstance(raw, str):
        if "://" in raw or ":" in raw.split("/", 1)[0]:  # a scheme (https:, javascript:, data:, file:)
            return Source(url=_url(raw, file))
        return Source(file=_inside(raw, file))
    if not isinstance(raw, dict):
        raise UsageError(f"{file}: source must be a URL, a file name or a [source] table, not {type(raw).__name__}")
    unknown = set(raw) - {"title", "publisher", "date", "url", "file"}
    if unknown:
        raise UsageError(
            f"{file}: unknown key(s) {', '.join(sorted(unknown))} in [source]; valid: title, publisher, date, url, file"
        )
    for key in ("title", "publisher", "date"):
        if key in raw and not isinstance(raw[key], str):
            raise UsageError(f"{file}: [source] {key} must be text")
    return Source(
        raw.get("title"),
        raw.get("publisher"),
        raw.get("date"),
        _url(raw["url"], file) if "url" in raw else None,
        _inside(raw["file"], file) if "file" in raw else None,
    )


def load_claims(path: str | Path | None = None) -> dict:
    file = Path(path) if path else data_path(DEFAULT_CLAIMS)
    if not file.is_file():
        raise UsageError(f"claims file not found: {file}")
    try:
        doc = tomllib.loads(file.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{file}: not valid TOML ({' '.join(str(exc).split())})") from None
    doc["source"] = parse_source(doc.get("source"), file)
    claims = doc.get("claims")
    if not isinstance(claims, list) or not claims:
        raise UsageError(f"{file}: no [[claims]] entries")
    defaults = doc.get("defaults", {})
    for i, claim in enumerate(claims):
        for key in ("id", "text", "quantity", "claimed"):
            if key not in claim:
                raise UsageError(f"{file}: claim #{i + 1} lacks '{key}'")
        if claim["quantity"] not in QUANTITIES:
            raise unknown_choice(f"quantity in claim {claim['id']!r}:", claim["quantity"], QUANTITIES)
        if claim.get("measured_on", MEASURED_ON[0]) not in MEASURED_ON:
            raise unknown_choice(f"measured_on in claim {claim['id']!r}:", str(claim["measured_on"]), MEASURED_ON)
        for key, value in defaults.items():
            claim.setdefault(key, value)
        _check_numbers(claim, file)
        if "source" in claim:  # a claim quoted from another publication than the file's
            claim["source"] = parse_source(claim["source"], file)
    return doc


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_numbers(claim: dict, file: Path) -> None:
    """A claim's numbers as its verdict needs them (TOML has nan and inf): one line naming the key if not."""
    where = f"{file}: claim {claim['id']!r}"
    claimed = claim["claimed"]
    if claim["quantity"] != "external" and not _number(claimed):
        raise UsageError(f"{where}: claimed must be a finite number (external claims may be text), got {claimed!r}")
    tolerance = claim.get("tolerance_pct", 0)
    if not _number(tolerance) or tolerance < 0:
        raise UsageError(f"{where}: tolerance_pct must be a finite number >= 0 (percent), got {tolerance!r}")
    for key in ("context", "kv_budget_gb", "target_users"):
        if key in claim and (not _number(claim[key]) or claim[key] <= 0):
            raise UsageError(f"{where}: {key} must be a finite number > 0, got {claim[key]!r}")


def _verdict(claimed: float, derived: float, tolerance_pct: float, exact: bool) -> tuple[str, float]:
    delta = (derived - claimed) / claimed * 100 if claimed else math.inf
    if exact:
        return ("holds" if derived == claimed else "fails"), delta
    if abs(delta) <= tolerance_pct:
        return "holds", delta
    if abs(delta) <= 2 * tolerance_pct:
        return "off", delta
    return "fails", delta


def _budget(claim: dict, model):
    if claim["quantity"] == "kv_per_user_gb":
        return budget_from_bytes(0, "not needed: bytes per user do not depend on the budget")
    if "kv_budget_gb" in claim:
        return budget_from_bytes(claim["kv_budget_gb"] * GB, "the claim's stated budget")
    util = claim.get("utilization", "vllm-default")
    util = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if util == "vllm-default" else float(util)
    # the claim's context is the server's max_model_len: vLLM's profiling run, and so its peak, depends on it
    return budget_from_gpu(get_gpu(claim["gpu"]), model, utilization=util, max_model_len=claim.get("context"))


def derive(claim: dict) -> tuple[float | None, str]:
    """(derived value, how it was derived) for one claim."""
    quantity = claim["quantity"]
    if quantity in ("external", "accuracy_loss_points", "ttft_speedup"):
        return None, claim.get("reason", "not derivable from specs")
    model = load_model(claim["model"])
    if quantity == "bytes_per_element":
        fmt = get_format(claim["dtype"])
        bpe = fmt.bytes_per_element(model)
        scales = f" + {fmt.scale_bits} scale bits per {fmt.scale_block} values" if fmt.scale_block else ""
        return bpe, f"{fmt.element_bits(model):g} data bits{scales} = {bpe:g} B per element ({fmt.source})"
    if quantity == "bytes_ratio":
        fmt, base = get_format(claim["dtype"]), get_format(claim["baseline"])
        ratio = 1 / format_ratio(fmt, base, model)
        return ratio, f"{fmt.bytes_per_element(model):g} / {base.bytes_per_element(model):g} B per element"
    if quantity == "kv_budget_gb":
        budget = _budget(claim, model)
        return budget.kv_bytes / GB, budget.derivation

    fmt = get_format(claim["dtype"])
    budget = _budget(claim, model)
    row = capacity_row(model, fmt, claim["context"], budget)
    page = (
        f"{row.blocks_per_request} blocks x {row.pool_block_bytes:,.0f} B (16-token "
        f"pages over {model.num_layers} layers)"
    )
    if quantity == "kv_per_user_gb":
        return row.bytes_per_user / GB, (
            f"{page} = {row.bytes_per_user / GB:.4f} GB; the article's "
            f"formula gives {row.naive_bytes_per_user / GB:.4f} GB"
        )
    if quantity == "users":
        return row.users, (
            f"floor({budget.kv_bytes / GB:g} GB / {row.bytes_per_user / GB:.4f} GB per user) = {row.users}; "
            f"the article's {fmt.article_bytes_per_element:g} B/elem formula gives {row.naive_users:.1f}"
        )
    if quantity == "users_ratio":
        # the figure `kvbench capacity` shows as "vs auto": vLLM's max concurrency of each dtype on the same pool
        # at the claim's context (a hybrid's or an MLA model's ratio is not the formats' bytes ratio)
        base = capacity_row(model, get_format(claim["baseline"]), claim["context"], budget)
        ratio = row.max_concurrency / base.max_concurrency if base.max_concurrency else math.inf
        return ratio, (
            f"max concurrency {row.max_concurrency:.2f}x {fmt.key} / {base.max_concurrency:.2f}x {claim['baseline']} "
            f"at {claim['context']:,} tokens = {ratio:.2f} (capacity's vs-auto column); "
            f"whole users {row.users} / {base.users}"
        )
    if quantity == "gpus_needed":
        target = claim["target_users"]
        gpus = math.ceil(target / row.users) if row.users else math.inf
        return gpus, f"ceil({target} users / {row.users} users per GPU) = {gpus}"
    raise AssertionError(quantity)


def evaluate(
    doc: dict,
    measured: Mapping[str, float] | None = None,
    notes: Mapping[str, str] | None = None,
    judgements: Mapping[str, dict] | None = None,
) -> list[Verdict]:
    """Verdicts for every claim; `measured` maps a claim id to a value a kvbench run measured, `notes` to why a
    run that matched it gave none, `judgements` an accuracy claim to its run's verdict (measured_values fills
    all three)."""
    measured, notes, judgements = measured or {}, notes or {}, judgements or {}
    out = []
    for claim in doc["claims"]:
        derived, how = derive(claim)
        quantity = claim["quantity"]
        value, label = measured.get(claim["id"]), None
        if quantity == "accuracy_loss_points" and claim["id"] in judgements:  # the run's verdict decides
            verdict, label, more, value = claims_accuracy.verdict(judgements[claim["id"]], float(claim["claimed"]))
            delta, how = None, f"{how}; {more}"
        elif quantity == "accuracy_loss_points":  # "less than N points lost": judged on what a run measured
            if value is None:
                verdict, delta = "not checkable", None
            else:
                verdict, delta = ("holds" if value < float(claim["claimed"]) else "fails"), None
                how = f"{how}; measured {value:.2f} points lost vs auto on the same items"
        elif quantity == "ttft_speedup":  # "up to N x": a run that reaches N bears it out, one below does not
            if value is None:
                verdict, delta = "not checkable", None
            else:
                verdict, delta = _verdict(float(claim["claimed"]), value, claim["tolerance_pct"], False)
                verdict = "holds" if value >= float(claim["claimed"]) else verdict
                how = f"{how}; measured {value:.2f}x ({claim['baseline']} TTFT P50 / {claim['dtype']} TTFT P50)"
        elif derived is None:
            verdict, delta = "not checkable", None
        else:
            verdict, delta = _verdict(
                float(claim["claimed"]), derived, claim["tolerance_pct"], claim.get("exact", False)
            )
        if claim["id"] in notes:
            how = f"{how}; {notes[claim['id']]}"
        out.append(
            Verdict(
                id=claim["id"],
                text=claim["text"],
                where=claim.get("where", ""),
                quantity=quantity,
                unit=UNITS[quantity],
                claimed=claim["claimed"],
                derived=derived,
                derivation=how,
                verdict=verdict,
                delta_pct=delta,
                measured=value,
                measure=claim.get("measure"),
                source=claim["source"].describe() if isinstance(claim.get("source"), Source) else None,
                detail=label,
            )
        )
    return out


def measured_values(
    doc: dict, runs, notes: dict[str, str] | None = None, judgements: dict[str, dict] | None = None
) -> dict[str, float]:
    """Claim id -> the value a kvbench run measured, where a run matches the claim's conditions.

    `runs` is `kvbench.records.summary_frame(...)`. Only the engine's own numbers count
    (engine_max_concurrency, engine_capacity_ratio, kv_budget_gb), and only from the newest run of the
    claim's model (short name or its Hugging Face id) at the claim's context whose KV budget is within
    the claim's tolerance of the claimed budget."""
    from kvbench.specs.models import catalog as model_catalog

    out: dict[str, float] = {}
    notes = {} if notes is None else notes  # claim id -> why a run did not give a value (kept for the output)
    judgements = {} if judgements is None else judgements  # accuracy claim id -> what the run's verdict says
    if runs is None or runs.empty:
        return out
    ok = runs[runs["status"] == "ok"]
    models = model_catalog()
    for claim in doc.get("claims", []):
        measure, budget_gb = claim.get("measure"), claim.get("kv_budget_gb")
        any_model = claim.get("measured_on") == "any-model"
        if measure == "accuracy_drop_points":  # judged by the run's verdict (kvbench.analysis.claims_accuracy)
            judged = claims_accuracy.judge(ok, claim, models)
            if judged is not None:
                judgements[claim["id"]] = judged
                if judged.get("drop") is not None and not judged["context_only"]:
                    out[claim["id"]] = judged["drop"]
            continue
        if any_model and measure == "engine_capacity_ratio":
            ratio = _capacity_ratio_any_model(ok, claim, notes)
            if ratio is not None:
                out[claim["id"]] = ratio
            continue
        if measure == "prefix_cache_ttft_speedup":
            speedup = _prefix_cache_ttft_speedup(ok, claim, notes)
            if speedup is not None:
                out[claim["id"]] = speedup
            continue
        if not measure or not claim.get("context"):
            continue
        names = {claim.get("model"), (models.get(claim.get("model")) or {}).get("hf_id")} - {None}
        match = ok[ok["model"].isin(names) & (ok["context"] == claim["context"])]
        if budget_gb:
            tol = claim.get("tolerance_pct", 5) / 100
            match = match[(match["budget_bytes"] / 1e9 - budget_gb).abs() <= tol * budget_gb]
        if match.empty:
            continue
        newest = match[match["run_id"] == match.sort_values("created_at")["run_id"].iloc[-1]]
        by_dtype = newest.set_index("kv_cache_dtype")
        dtype = claim.get("dtype")
        if measure == "engine_max_concurrency" and dtype in by_dtype.index:
            out[claim["id"]] = float(by_dtype.at[dtype, "engine_max_concurrency"])
        elif measure == "kv_budget_gb" and dtype in by_dtype.index:
            out[claim["id"]] = float(by_dtype.at[dtype, "budget_bytes"]) / 1e9
        elif measure == "engine_capacity_ratio" and {dtype, claim.get("baseline")} <= set(by_dtype.index):
            engine = by_dtype["engine_max_concurrency"]
            out[claim["id"]] = float(engine[dtype] / engine[claim["baseline"]])
    return {k: v for k, v in out.items() if v == v}  # drop NaN


def _capacity_ratio_any_model(runs, claim: dict, notes: dict) -> float | None:
    """The engine's max concurrency of the claim's dtype over its baseline's, in the newest run with both."""
    pair = [claim.get("dtype"), claim.get("baseline")]
    if "engine_max_concurrency" not in runs:
        return None
    for run in _newest_first(runs[runs["engine_max_concurrency"].notna()]):
        if set(pair) <= set(run.index) and run.at[pair[1], "engine_max_concurrency"] > 0:
            notes[claim["id"]] = _measured_where(run, claim)
            return float(run.at[pair[0], "engine_max_concurrency"] / run.at[pair[1], "engine_max_concurrency"])
    return None


def _prefix_cache_ttft_speedup(runs, claim: dict, notes: dict[str, str]) -> float | None:
    """The baseline's TTFT P50 over the claim's dtype's, in the newest run of a prefix-sharing workload where
    both served it (any model: such a claim names none). Where a cache holds more prefixes, more requests hit.
    A run where either side was emulated has no speed to compare: it leaves a note with the two prefix-cache hit
    rates instead (what the emulation does measure) and the search goes on to older runs."""
    if "workload_kind" not in runs:
        return None
    match = runs[runs["workload_kind"].isin(PREFIX_SHARING_WORKLOADS) & runs["ttft_p50_ms"].notna()]
    pair = [claim.get("dtype"), claim.get("baseline")]
    for run in _newest_first(match):
        if not set(pair) <= set(run.index) or not run.at[pair[0], "ttft_p50_ms"] > 0:
            continue
        if "emulated" in run and run.loc[pair, "emulated"].astype(bool).any():
            if claim["id"] not in notes:
                notes[claim["id"]] = _emulated_hit_note(run, pair)
            continue
        return float(run.at[pair[1], "ttft_p50_ms"] / run.at[pair[0], "ttft_p50_ms"])
    return None


def _emulated_hit_note(run, pair: list[str]) -> str:
    emulated = [d for d in pair if bool(run.at[d, "emulated"])]
    hits = {d: run.at[d, "prefix_hit_rate"] if "prefix_hit_rate" in run else None for d in pair}
    text = f"not checkable on {', '.join(emulated)}: its TTFT is emulated (run {run['run_id'].iloc[0]})"
    if all(h is not None and h == h for h in hits.values()):
        ratio = f"{hits[pair[0]] / hits[pair[1]]:.2f}x" if hits[pair[1]] else "n/a"
        text += (
            f"; prefix-cache hit rate {pair[0]} {hits[pair[0]]:.1%} vs {pair[1]} {hits[pair[1]]:.1%} "
            f"({ratio}), which the emulation measures"
        )
    return text
