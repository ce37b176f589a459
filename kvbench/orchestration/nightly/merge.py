"""`kvbench nightly --merge`: a night's shard folders back into results/<machine>/, then the night's summary,
the regression gate and the dashboard rebuilt as if one machine had run every shard.

Each expected shard (from the partition the manifests carry, or the launcher's plan.json) is merged whole
or not at all. It is not merged when it never arrived, did not finish (no manifest), failed as a whole,
fails validation (a file missing or altered, a run record that does not parse as a typed record or belongs
to no unit it owns, an asv result asv cannot read) or claims a unit the partition gives another shard; then
every unit it owned is reported failed with that reason, and the other shards merge. The gate and the
dashboard run once over the merged results, through the same steps a single machine's night runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from kvbench.core.errors import UsageError
from kvbench.orchestration.nightly import manifest as mf
from kvbench.orchestration.nightly.orchestrate import Nightly
from kvbench.orchestration.nightly.outcomes import EntryResult, EntryStatus, StepResult, StepStatus
from kvbench.orchestration.nightly.shards import HISTORY
from kvbench.orchestration.nightly.target import Target

SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")
REPLACEABLE = ("machine.json", "benchmarks.json")  # asv rewrites these on every point


@dataclass
class Arrival:
    """One shard folder as found."""

    folder: Path
    manifest: mf.ShardManifest | None
    problem: str | None = None

    @property
    def key(self) -> tuple[str, str] | None:
        if self.manifest is not None:
            return self.manifest.night, self.manifest.section
        parts = self.folder.parts
        return (parts[-3], parts[-2]) if len(parts) >= 3 and SHARD_DIR.match(parts[-1]) else None

    @property
    def index(self) -> int | None:
        if self.manifest is not None:
            return self.manifest.shard
        m = SHARD_DIR.match(self.folder.name)
        return int(m.group(1)) if m else None


@dataclass
class Slot:
    """One shard the night's partition expects."""

    index: int
    units: list[str]
    arrival: Arrival | None = None
    problem: str | None = None  # why it is not merged; None once merged

    @property
    def merged(self) -> bool:
        return self.arrival is not None and self.problem is None


@dataclass
class Group:
    """One section's night: its partition, config and shards."""

    night: str
    section: str
    machine: str | None
    config: dict[str, str]
    plan: dict
    slots: list[Slot]
    extra: list[str] = field(default_factory=list)  # problems of folders that fit no slot (duplicates)

    def slot_of(self, unit: str) -> Slot | None:
        return next((s for s in self.slots if unit in s.units), None)


# -- finding the shards -------------------------------------------------------------------------------------


def find(paths: list[Path], depth: int = 4) -> tuple[list[Arrival], list[dict]]:
    """Shard folders under the given folders, and the fleet plans (plan.json) given or found beside them."""
    arrivals: list[Arrival] = []
    fleets: list[dict] = []

    def walk(p: Path, left: int) -> None:
        if (p / mf.MANIFEST).is_file() or SHARD_DIR.match(p.name):
            try:
                arrivals.append(Arrival(p, mf.read_manifest(p)))
            except UsageError as exc:
                arrivals.append(Arrival(p, None, str(exc)))
            return
        if (p / "plan.json").is_file():
            fleets.append(read_fleet(p / "plan.json"))
        if left > 0:
            for child in sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith(".")):
                walk(child, left - 1)

    for p in paths:
        if p.is_file():
            fleets.append(read_fleet(p))
        elif p.is_dir():
            walk(p, depth)
        else:
            raise UsageError(f"--merge {p}: no such folder or file; give shard folders, a bucket path or a plan.json")
    return arrivals, fleets


def read_fleet(path: Path) -> dict:
    from kvbench.orchestration.nightly.fleet import SCHEMA

    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--merge {path}: not a fleet plan ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UsageError(f"--merge {path}: not a fleet plan (schema {SCHEMA}); give shard folders or a plan.json")
    return doc


def _slots(plan: dict) -> list[Slot]:
    units: dict[int, list[str]] = {i: [] for i in range(1, int(plan["shards"]) + 1)}
    for u in plan.get("units", []):
        units.setdefault(int(u["shard"]), []).append(u["name"])
    return [Slot(i, names) for i, names in sorted(units.items()) if names]


def groups(arrivals: list[Arrival], fleets: list[dict]) -> tuple[list[Group], list[str]]:
    """The nights' sections with every arrival in its slot; problems of folders that belong nowhere."""
    out: dict[tuple[str, str], Group] = {}
    for fleet in fleets:  # the launcher's plan: sections expected even if none of their shards arrived
        for section, plan in fleet["sections"].items():
            out[(fleet["night"], section)] = Group(
                fleet["night"], section, plan.get("machine"), fleet["config"], plan, _slots(plan)
            )
    for a in arrivals:
        if a.manifest is not None and a.key not in out:
            m = a.manifest
            out[a.key] = Group(m.night, m.section, m.machine, m.config, m.plan, _slots(m.plan))
    stray = []
    for a in sorted(arrivals, key=lambda a: str(a.folder)):
        group = out.get(a.key) if a.key else None
        if group is None:
            stray.append(f"{a.folder}: {a.problem or 'not a shard folder of any night given'}")
            continue
        place(group, a)
    return list(out.values()), stray


def place(group: Group, a: Arrival) -> None:
    slot = next((s for s in group.slots if s.index == a.index), None)
    if slot is None:
        group.extra.append(f"{a.folder}: shard {a.index} is not a shard of this night's partition")
        return
    if slot.arrival is not None:
        group.extra.append(f"{a.folder}: a second copy of shard {slot.index} (merged: {slot.arrival.folder})")
        return
    slot.arrival = a
    slot.problem = a.problem or check(group, slot, a)


# -- validating one shard -------------------------------------------------------------------------------------


def check(group: Group, slot: Slot, a: Arrival) -> str | None:
    """Why this shard's folder cannot be merged, or None."""
    m = a.manifest
    assert m is not None
    if m.config.get("sha256") != group.config.get("sha256"):
        return "it ran another config than the night's (its SHA-256 differs)"
    if _owners(m.plan) != _owners(group.plan) or m.shards != int(group.plan["shards"]):
        return "its partition differs from the night's"
    others = [u for u in m.units if u not in slot.units]
    if others:
        owners = {u: getattr(group.slot_of(u), "index", None) for u in others}
        return "claims " + ", ".join(f"{u!r} (the partition gives it to shard {owners[u]})" for u in others)
    if m.error is not None and m.summary is None:
        return f"failed: {m.error}"
    if group.machine is None:
        group.machine = m.machine
    if m.machine != group.machine:
        return f"it wrote results/{m.machine}/, the night's other shards results/{group.machine}/"
    problems = mf.check_files(a.folder, m)
    problems += [p for rel in m.files if (p := check_file(a.folder, rel, m, group))]
    if m.summary is None:
        problems.append(f"no {mf.SUMMARY}")
    if not problems:
        return None
    return f"invalid: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


def _owners(plan: dict) -> list[tuple[int, str]]:
    return sorted((int(u["shard"]), str(u["name"])) for u in plan.get("units", []))


def check_file(folder: Path, rel: str, m: mf.ShardManifest, group: Group) -> str | None:
    parts = Path(rel).parts
    if rel in (mf.SUMMARY, mf.BUNDLE) or rel == f"{mf.RESULTS}/benchmarks.json":
        return None
    if parts[:2] != (mf.RESULTS, m.machine):
        return f"{rel}: outside results/{m.machine}/"
    path = folder / rel
    if len(parts) == 4 and parts[2] == "runs" and rel.endswith(".json"):
        return check_record(path, rel, m)
    if len(parts) == 3 and rel.endswith(".json") and parts[2] not in REPLACEABLE:
        if HISTORY not in m.units:
            return f"{rel}: an asv result from a shard that does not own the history point"
        return check_asv(path, rel, m.machine)
    return None


def check_record(path: Path, rel: str, m: mf.ShardManifest) -> str | None:
    from kvbench.records import read_record

    try:
        doc = read_record(path).as_doc()
    except UsageError as exc:
        return str(exc).replace(str(path), rel)
    tag = doc.get("nightly")
    if isinstance(tag, dict):
        if tag.get("entry") not in m.units:
            return f"{rel}: a record of {tag.get('entry')!r}, which this shard does not own"
        return None
    if isinstance(doc.get("asv"), dict) and HISTORY in m.units:
        return None  # the history point's serving run
    return f"{rel}: a run record of no unit this shard owns"


def check_asv(path: Path, rel: str, machine: str) -> str | None:
    from asv.results import Results
    from asv.util import UserError

    from kvbench.analysis.history import bad_value

    try:
        bad = bad_value(Results.load(str(path), machine_name=machine))
    except (UserError, ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
        bad = " ".join(str(exc).split())[:200]
    return f"{rel}: not a readable asv result ({bad})" if bad else None


def collisions(a: Arrival, results_dir: Path) -> list[str]:
    """Files the shard would overwrite with other content (a run record never is; asv's files may be)."""
    out = []
    for rel in a.manifest.files:
        if not rel.startswith(f"{mf.RESULTS}/"):
            continue
        dest = results_dir / rel.split("/", 1)[1]
        if dest.is_file() and Path(rel).name not in REPLACEABLE and "runs" in Path(rel).parts:
            if mf.sha256(dest) != a.manifest.files[rel]:
                out.append(f"{rel}: results/ already holds another file of that name")
    return out


def copy_in(a: Arrival, results_dir: Path) -> None:
    """Every results file of the shard into results_dir, each written atomically."""
    for rel in a.manifest.files:
        if not rel.startswith(f"{mf.RESULTS}/"):
            continue
        dest = results_dir / rel.split("/", 1)[1]
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        try:
            shutil.copy2(a.folder / rel, tmp)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


# -- the merged night ----------------------------------------------------------------------------------------


@dataclass
class Planned:
    """The launcher's estimate of the serial night, as the merged summary reports it."""

    minutes: float
    price_per_hour: float | None = None


class MergedNight(Nightly):
    """A night whose entries and history point ran on shards: its gate, dashboard and summary are a
    single machine's (Nightly's own steps), its entries and history step are the shards' records."""

    def __init__(self, group: Group, asv_conf: Path, site_out: Path | None, console):
        from kvbench.orchestration.nightly import config as nconfig
        from kvbench.orchestration.nightly.matrix import expand

        where = f"the config of night {group.night} ({group.config.get('path')})"
        try:
            raw = tomllib.loads(group.config["text"])
        except (KeyError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"{where}: not valid TOML ({exc})") from None
        cfg = nconfig.parse(raw, where)
        plan = expand(cfg, group.section)
        first = next((_summary(s) for s in group.slots if s.merged), {})
        vllm = first.get("vllm") or {}
        target = Target(group.section, group.machine or group.section, 0, first.get("gpu"))
        super().__init__(
            cfg,
            Path(group.config.get("path", "")),
            plan,
            target,
            Planned(float(group.plan.get("serial_minutes") or 0.0)),
            asv_conf,
            site_out or Path(cfg.dashboard.out),
            console,
            (vllm.get("package"), vllm.get("version")),
            night_id=f"{group.night}-{target.machine}",
        )
        self.group = group
        self.summaries: dict[int, dict] = {}
        started = [s.arrival.manifest.started_at for s in group.slots if s.arrival and s.arrival.manifest]
        finished = [s.arrival.manifest.finished_at for s in group.slots if s.arrival and s.arrival.manifest]
        self.started_at = min(started) if started else self.started_at
        self._span = (min(started), max(finished)) if started else None

    def minutes(self) -> float:
        from datetime import datetime

        if self._span is None:
            return 0.0
        a, b = (datetime.fromisoformat(t) for t in self._span)
        return (b - a).total_seconds() / 60

    def gather(self) -> None:
        """The history step and the entries, in the config's order, from the shards that own them."""
        self.summaries = {s.index: _summary(s) for s in self.group.slots if s.merged}
        if self.cfg.history.enabled:
            self.steps["history"] = self._history_step()
        else:
            self.steps["history"] = StepResult("history", StepStatus.SKIPPED, "disabled in [history]")
        for entry in self.plan.entries:
            slot = self.group.slot_of(entry.name)
            done = (self.summaries.get(slot.index) or {}) if slot else {}
            found = next((e for e in done.get("entries", []) if e.get("name") == entry.name), None)
            if found is not None:
                self.entries.append(self._entry(found))
                continue
            why = self._why(slot) if slot and not slot.merged else f"{self._tag(slot)} did not report it"
            self.entries.append(EntryResult(entry.name, EntryStatus.FAILED, self._planned_s(entry.name), error=why))

    def _history_step(self) -> StepResult:
        slot = self.group.slot_of(HISTORY)
        if slot is None:
            return StepResult("history", StepStatus.SKIPPED, "not in the night's partition")
        step = ((self.summaries.get(slot.index) or {}).get("steps") or {}).get("history")
        if not slot.merged or step is None:
            return StepResult("history", StepStatus.FAILED, self._why(slot) if not slot.merged else "not reported")
        names = {f.name for f in fields(StepResult)}
        result = StepResult(**{k: v for k, v in step.items() if k in names})
        result.status = StepStatus(result.status)
        result.log = self._abs(result.log)
        if isinstance(result.data.get("record"), str):
            result.data = {**result.data, "record": self._abs(result.data["record"])}
        return result

    def _entry(self, e: dict) -> EntryResult:
        names = {f.name for f in fields(EntryResult)}
        out = EntryResult(**{k: v for k, v in e.items() if k in names})
        out.status, out.record = EntryStatus(out.status), self._abs(out.record)
        return out

    def _planned_s(self, name: str) -> float:
        return 60 * next((float(u.get("minutes") or 0) for u in self.group.plan["units"] if u["name"] == name), 0.0)

    def _abs(self, rel: str | None) -> str | None:
        return str(self.results_dir / rel) if rel and not Path(rel).is_absolute() else rel

    def _tag(self, slot: Slot | None) -> str:
        return f"shard {slot.index}/{self.group.plan['shards']}" if slot else "no shard"

    def _why(self, slot: Slot) -> str:
        """Why a unit has no result: its shard's problem (the summary's `shards` names the folder)."""
        return f"{self._tag(slot)} never arrived" if slot.arrival is None else f"{self._tag(slot)}: {slot.problem}"

    def reasons(self) -> list[str]:
        # a shard that is not merged shows as each of its units failing; folders that fit no shard, here
        return [f"not merged: {line}" for line in self.group.extra] + super().reasons()

    def summary_doc(self) -> dict:
        doc = super().summary_doc()
        doc["shards"] = [
            {
                "shard": s.index,
                "of": int(self.group.plan["shards"]),
                "units": s.units,
                "merged": s.merged,
                "folder": str(s.arrival.folder) if s.arrival else None,
                "host": s.arrival.manifest.host if s.arrival and s.arrival.manifest else None,
                "nodes": s.arrival.manifest.nodes if s.arrival and s.arrival.manifest else [],
                "vllm": (self.summaries.get(s.index) or {}).get("vllm"),
                "problem": s.problem if s.arrival else "never arrived",
            }
            for s in self.group.slots
        ]
        return doc


def _summary(slot: Slot) -> dict:
    path = slot.arrival.folder / (slot.arrival.manifest.summary or mf.SUMMARY)
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def merge(groups_: list[Group], asv_conf: Path, site_out: Path | None, console) -> list[MergedNight]:
    """Copy every valid shard in, then per night: history and entries gathered, the gate; the dashboard
    once over everything; every night's summary written."""
    nights = []
    for g in groups_:
        night = MergedNight(g, asv_conf, site_out, console)
        for s in g.slots:
            if s.merged and (clash := collisions(s.arrival, night.results_dir)):
                s.problem = f"invalid: {clash[0]}"
        for s in g.slots:
            if s.merged:
                copy_in(s.arrival, night.results_dir)
        night.gather()
        night.steps["gate"] = night.gate()
        nights.append(night)
    if nights:
        board = nights[0].dashboard()
        for night in nights:
            night.steps["dashboard"] = board
            night.doc = night.write_summary()
    return nights


def gather(paths: list[str]) -> tuple[list, list[str]]:
    """`--merge`'s arguments (shard folders, bucket paths or the launcher's plan.json) as the nights' groups of
    shards and the lines of what belongs to none; a bucket path is fetched first, and a plan's bucket holds
    its shards unless they were given too. No group at all is a usage error that names what was wrong."""
    from kvbench.orchestration.nightly import fleet as fl

    local = [_fetched(p) for p in paths]
    arrivals, fleets = find(local)
    for plan in fleets:
        if plan.get("outputs") and not any(a.key and a.key[0] == plan["night"] for a in arrivals):
            more, _ = find([fl.download(plan["outputs"], Path("shards") / plan["night"])])
            arrivals += more
    found, stray = groups(arrivals, fleets)
    if not found:
        damaged = [a for a in arrivals if a.problem]  # N-P2: a shard folder was there; say what is wrong with it
        if damaged:
            more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
            raise UsageError(f"--merge: shard folder {damaged[0].folder} cannot be merged: {damaged[0].problem}{more}")
        raise UsageError(f"--merge found no shard folder or fleet plan in {', '.join(paths)}")
    return found, stray


def _fetched(p: str) -> Path:
    from kvbench.orchestration.nightly import fleet as fl

    if p.startswith(("s3://", "gs://")):
        return fl.download(p, Path("shards") / Path(p.rstrip("/")).name)
    return Path(p)
