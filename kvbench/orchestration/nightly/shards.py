"""A machine section's night cut into shards that run on separate machines at the same time.

The unit of sharding is one matrix entry (one `kvbench run`: every KV dtype of the entry on the same
machine, so each dtype's comparison with auto stays paired) or the asv history point (one `kvbench history
run`: its serving benchmark also runs every dtype). Units are dealt to N shards longest first, each to the
shard with the fewest estimated minutes so far (LPT: within 4/3 of the best possible longest shard). The
wall-clock of the night is then its longest shard; its GPU-hours and cost are the serial night's, since
every unit runs once.

The partition depends on the estimate, and the estimate on what is installed (the capacity model reads
the installed vLLM's defaults), so a launcher computes it once and hands every shard the whole partition
(`kvbench nightly --shard-plan FILE`): shards never re-derive who owns what on their own machines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from kvbench.core.errors import UsageError
from kvbench.orchestration.nightly.estimate import MachineEstimate
from kvbench.orchestration.nightly.matrix import MachinePlan

HISTORY = "history"  # the unit name of the asv history point (entry names hold "/": no clash)
PLAN_SCHEMA = "kvbench.shard-plan/1"


@dataclass(frozen=True)
class Unit:
    name: str  # an entry name, or HISTORY
    label: str  # what the dry run prints
    minutes: float
    dtypes: tuple[str, ...]


@dataclass
class Shard:
    index: int  # 1-based
    of: int
    units: list[Unit]

    @property
    def minutes(self) -> float:
        return sum(u.minutes for u in self.units)

    @property
    def names(self) -> list[str]:
        return [u.name for u in self.units]

    @property
    def owns_history(self) -> bool:
        return HISTORY in self.names

    @property
    def tag(self) -> str:
        return f"shard {self.index}/{self.of}"


@dataclass
class ShardPlan:
    section: str
    shards: list[Shard]
    serial_minutes: float
    gpus: int  # GPUs rented per shard (every shard rents the section's machine)
    price_per_hour: float | None  # USD per GPU-hour

    @property
    def wall_minutes(self) -> float:
        """The night with every shard in parallel: its longest shard."""
        return max((s.minutes for s in self.shards), default=0.0)

    @property
    def gpu_hours(self) -> float:
        return sum(s.minutes for s in self.shards) / 60 * self.gpus

    def usd(self, shard: Shard | None = None) -> float | None:
        if self.price_per_hour is None or not self.gpus:
            return None
        minutes = shard.minutes if shard is not None else sum(s.minutes for s in self.shards)
        return minutes / 60 * self.gpus * self.price_per_hour

    def shard(self, index: int) -> Shard:
        if not 1 <= index <= len(self.shards):
            raise UsageError(f"--shard {index} is not a shard of {len(self.shards)}; choose from: 1-{len(self.shards)}")
        return self.shards[index - 1]

    def owner(self) -> dict[str, int]:
        """unit name -> the index of the shard that owns it."""
        return {u.name: s.index for s in self.shards for u in s.units}

    def as_json(self) -> dict:
        return {
            "schema": PLAN_SCHEMA,
            "section": self.section,
            "shards": len(self.shards),
            "serial_minutes": self.serial_minutes,
            "wall_minutes": self.wall_minutes,
            "gpus": self.gpus,
            "price_per_hour": self.price_per_hour,
            "units": [
                {
                    "shard": s.index,
                    "name": u.name,
                    "label": u.label,
                    "minutes": u.minutes,
                    "dtypes": list(u.dtypes),
                }
                for s in self.shards
                for u in s.units
            ],
        }


def units(plan: MachinePlan, est: MachineEstimate) -> list[Unit]:
    """The night's units in plan order: every entry, then the history point if the night takes one."""
    names = [e.name for e in plan.entries]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise UsageError(f"[machines.{plan.key}] has two entries named {dup!r}; shards are dealt by entry name")
    out = [Unit(e.name, e.name, x.total_s / 60, e.kv_dtypes) for e, x in zip(plan.entries, est.entries, strict=True)]
    if est.history is not None:
        minutes = (est.history.total_s + est.history_other_s) / 60
        dtypes = tuple(d.dtype for d in est.history.dtypes)
        out.append(Unit(HISTORY, est.history.name, minutes, dtypes))
    return out


def deal(items: list[Unit], n: int) -> list[list[Unit]]:
    """Longest first, each to the least-loaded shard (ties: the lower index); each shard keeps plan order."""
    order = {u.name: i for i, u in enumerate(items)}
    bins: list[list[Unit]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for u in sorted(items, key=lambda u: (-u.minutes, order[u.name])):
        i = min(range(n), key=lambda k: (loads[k], k))
        bins[i].append(u)
        loads[i] += u.minutes
    return [sorted(b, key=lambda u: order[u.name]) for b in bins]


def shard_plan(plan: MachinePlan, est: MachineEstimate, n: int) -> ShardPlan:
    if n < 1:
        raise UsageError(f"--shards {n}: give 1 or more")
    items = units(plan, est)
    bins = deal(items, n)
    return ShardPlan(
        section=plan.key,
        shards=[Shard(i + 1, n, b) for i, b in enumerate(bins)],
        serial_minutes=est.minutes,
        gpus=plan.gpus,
        price_per_hour=est.price_per_hour,
    )


def from_json(doc: dict, plan: MachinePlan, where: str) -> ShardPlan:
    """A partition handed down by the launcher, checked against this config's section: every unit known,
    each owned once. Minutes are the launcher's estimate (the one the budget was checked against)."""
    if not isinstance(doc, dict) or doc.get("schema") != PLAN_SCHEMA:
        raise UsageError(f"{where}: not a kvbench shard plan (schema {PLAN_SCHEMA})")
    if doc.get("section") != plan.key:
        raise UsageError(f"{where}: a plan for [machines.{doc.get('section')}], not [machines.{plan.key}]")
    n = doc.get("shards")
    if not isinstance(n, int) or n < 1:
        raise UsageError(f"{where}: shards = {n!r}; give a count of 1 or more")
    valid = {e.name: e.kv_dtypes for e in plan.entries} | {HISTORY: ()}
    bins: list[list[Unit]] = [[] for _ in range(n)]
    seen: set[str] = set()
    for u in doc.get("units", []):
        name, index = u.get("name"), u.get("shard")
        if name not in valid:
            raise UsageError(f"{where}: unit {name!r} is not in [machines.{plan.key}]; valid: {', '.join(valid)}")
        if name in seen:
            raise UsageError(f"{where}: unit {name!r} is owned by two shards")
        if not isinstance(index, int) or not 1 <= index <= n:
            raise UsageError(f"{where}: unit {name!r} names shard {index!r}; choose from: 1-{n}")
        seen.add(name)
        bins[index - 1].append(Unit(name, u.get("label") or name, float(u.get("minutes") or 0.0), valid[name]))
    return ShardPlan(
        section=plan.key,
        shards=[Shard(i + 1, n, b) for i, b in enumerate(bins)],
        serial_minutes=float(doc.get("serial_minutes") or sum(u.minutes for b in bins for u in b)),
        gpus=int(doc.get("gpus") or plan.gpus),
        price_per_hour=doc.get("price_per_hour"),
    )


def read_plan(path: Path, plan: MachinePlan) -> ShardPlan:
    """A shard plan file: the launcher's fleet plan (one entry per section) or one section's plan."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"--shard-plan {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--shard-plan {path}: not a JSON shard plan ({exc})") from None
    if isinstance(doc, dict) and isinstance(doc.get("sections"), dict):  # the fleet plan
        if plan.key not in doc["sections"]:
            raise UsageError(
                f"--shard-plan {path} has no [machines.{plan.key}]; it plans: {', '.join(doc['sections'])}"
            )
        doc = doc["sections"][plan.key]
    return from_json(doc, plan, f"--shard-plan {path}")


def restrict(plan: MachinePlan, est: MachineEstimate, shard: Shard) -> tuple[MachinePlan, MachineEstimate]:
    """The section's plan and estimate cut down to one shard's units, in plan order."""
    owned = set(shard.names)
    keep = [i for i, e in enumerate(plan.entries) if e.name in owned]
    sub_plan = replace(plan, entries=[plan.entries[i] for i in keep])
    sub_est = replace(
        est,
        entries=[est.entries[i] for i in keep],
        history=est.history if shard.owns_history else None,
        history_other_s=est.history_other_s if shard.owns_history else 0.0,
    )
    return sub_plan, sub_est


def shard_plans(plans: dict, estimates: dict, n: int) -> dict:
    """Every machine section's plan cut into n shards (section key -> ShardPlan)."""
    return {k: shard_plan(plans[k], estimates[k], n) for k in plans}


def the_shard_plan(plan: MachinePlan, est: MachineEstimate, shards: int | None, plan_file: Path | None) -> ShardPlan:
    """One shard's partition: the launcher's --shard-plan file when given (checked against --shards), else cut
    here."""
    if plan_file is not None:
        sp = read_plan(plan_file, plan)
        if shards is not None and shards != len(sp.shards):
            raise UsageError(f"--shards {shards} but --shard-plan {plan_file} has {len(sp.shards)} shards")
        return sp
    return shard_plan(plan, est, shards)
