"""The night on rented machines: one SkyPilot task per shard, written from sky/nightly.yaml and submitted as
managed jobs (`sky jobs launch`: spot or on-demand, recovered when preempted, its cluster torn down after).

A task takes the template's setup, workdir and secrets, and sets: the section's GPU and count per node
(resources.accelerators), spot or on-demand ([fleet] spot), the nodes of a multi-node server (num_nodes),
and the shard's identity and the whole partition as envs for sky/shard.sh. Outputs go to the night's
bucket ([fleet] bucket, mounted) or, without one, stay on each shard's cluster (then launched as plain
clusters, not managed jobs: a managed job's cluster, disk included, is gone when it ends).

Secrets (HF_TOKEN) are named in the task file with no value and handed to SkyPilot from the environment at
submission; no file kvbench writes holds one.
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import KvbenchError, UsageError
from kvbench.orchestration.nightly.config import CPU, NightlyConfig
from kvbench.orchestration.nightly.estimate import MachineEstimate
from kvbench.orchestration.nightly.manifest import read_document
from kvbench.orchestration.nightly.matrix import MachinePlan, machine_folder
from kvbench.orchestration.nightly.shards import Shard, ShardPlan

SCHEMA = "kvbench.fleet/1"
TEMPLATE = Path("sky") / "nightly.yaml"  # relative to the checkout
MOUNT = "/kvbench-out"  # where the night's bucket is mounted on every node
KEEP_MINUTES = 60  # without a bucket: a cluster goes down this long after its shard, time to fetch it
TERMINAL = {"SUCCEEDED", "CANCELLED", "FAILED", "FAILED_SETUP", "FAILED_PRECHECKS", "FAILED_NO_RESOURCE"}
TERMINAL |= {"FAILED_CONTROLLER"}


@dataclass
class Fleet:
    night: str
    config_rel: str  # the config, relative to the checkout (what the shards read)
    config: dict[str, str]  # path, sha256, text
    bucket: str | None
    spot: bool
    plans: dict[str, MachinePlan]
    estimates: dict[str, MachineEstimate]
    shards: dict[str, ShardPlan]

    @property
    def outputs(self) -> str | None:
        """Where the night's shard folders land: <bucket>/<night>, or None (each cluster's disk)."""
        return f"{self.bucket.rstrip('/')}/{self.night}" if self.bucket else None

    def launched(self) -> list[tuple[str, Shard]]:
        """(section, shard) of every shard that owns something: an empty shard rents nothing."""
        return [(k, s) for k, sp in self.shards.items() for s in sp.shards if s.units]

    def as_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "night": self.night,
            "config": self.config,
            "config_rel": self.config_rel,
            "bucket": self.bucket,
            "outputs": self.outputs,
            "spot": self.spot,
            "sections": {
                k: {**sp.as_json(), "machine": machine_folder(self.plans[k])} for k, sp in self.shards.items()
            },
        }


def new_night() -> str:
    return time.strftime("%Y%m%dt%H%Mz", time.gmtime())  # lower case: it is part of job and cluster names


def gpu_sections(cfg: NightlyConfig, gpu: str | None) -> list[str]:
    if gpu is not None:
        if gpu == CPU:
            raise UsageError("--launch rents GPUs; [machines.cpu] runs on this machine (drop --gpu cpu)")
        return [gpu]
    keys = [k for k in cfg.machines if k != CPU]
    if not keys:
        raise UsageError("the nightly config has no GPU section to launch; add a [machines.<gpu>] section")
    return keys


def accelerator(plan: MachinePlan) -> str:
    from kvbench.core.datafiles import load_toml

    name = plan.cfg.accelerator or load_toml("fleet.toml")["accelerators"].get(plan.key)
    if name is None:
        known = load_toml("fleet.toml")["accelerators"]
        raise UsageError(
            f'[machines.{plan.key}] has no SkyPilot accelerator name; set accelerator = "..." there '
            f"(`sky show-gpus` lists them; kvbench knows: {', '.join(f'{k}={v}' for k, v in known.items())})"
        )
    return name


def checkout_relative(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        raise UsageError(
            f"--config {path} is outside the checkout {root}: SkyPilot syncs the checkout to each shard, "
            "so put the config inside it"
        ) from None


# -- the task files -------------------------------------------------------------------------------------


def load_template(root: Path) -> dict:
    import yaml

    path = Path(root) / TEMPLATE
    doc = read_document(
        path,
        yaml.safe_load,
        (yaml.YAMLError,),
        f"{path} not found: run --launch from the kvbench checkout",
        lambda exc: f"{path}: not valid YAML ({' '.join(str(exc).split())})",
    )
    if not isinstance(doc, dict) or "setup" not in doc or "resources" not in doc:
        raise UsageError(f"{path}: not a SkyPilot task with setup and resources")
    return doc


def job_name(night: str, section: str, shard: Shard) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", f"kvb-{night}-{section}-{shard.index}of{shard.of}".lower())


def task_for(template: dict, fleet: Fleet, section: str, shard: Shard, root: Path, cfg: NightlyConfig) -> dict:
    plan = fleet.plans[section]
    task = copy.deepcopy(template)
    task["name"] = job_name(fleet.night, section, shard)
    task["workdir"] = str(Path(root).resolve())  # the checkout: the fleet folder may be anywhere
    per_node = plan.cfg.gpus or plan.cfg.tensor_parallel_size
    resources = {k: v for k, v in task["resources"].items() if k not in ("accelerators", "use_spot", "disk_size")}
    resources.update({"accelerators": f"{accelerator(plan)}:{per_node}", "use_spot": fleet.spot})
    resources["disk_size"] = cfg.fleet.disk_size
    if cfg.fleet.infra:
        resources["infra"] = cfg.fleet.infra
    task["resources"] = resources
    if plan.cfg.nodes > 1:
        task["num_nodes"] = plan.cfg.nodes
        # vLLM's multi-node serving runs over Ray, installed beside vLLM on every node
        task["setup"] = task["setup"].rstrip("\n") + "\nuv pip install 'ray[default]'\n"
    envs = dict(task.get("envs") or {})
    envs.update(
        {
            "KVBENCH_CONFIG": fleet.config_rel,
            "KVBENCH_NIGHT": fleet.night,
            "KVBENCH_SECTION": section,
            "KVBENCH_SHARD": str(shard.index),
            "KVBENCH_SHARDS": str(shard.of),
            "KVBENCH_SHARD_PLAN": json.dumps(fleet.shards[section].as_json(), separators=(",", ":")),
        }
    )
    if fleet.bucket:
        envs["KVBENCH_BUCKET_DIR"] = MOUNT
        task["file_mounts"] = {**(task.get("file_mounts") or {}), MOUNT: {"source": fleet.bucket, "mode": "MOUNT"}}
    task["envs"] = envs
    task["run"] = "bash sky/shard.sh\n"
    return task


def _dumper():
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):  # scripts as literal blocks, as in sky/nightly.yaml
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return Dumper


def write_tasks(fleet: Fleet, cfg: NightlyConfig, root: Path, out_dir: Path) -> list[tuple[Path, str, str, Shard]]:
    """One task file per launched shard and the fleet plan (plan.json) in out_dir; (path, job name, section, shard)."""
    import yaml

    from kvbench.records import write_atomic

    dumper = _dumper()
    template = load_template(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for section, shard in fleet.launched():
        task = task_for(template, fleet, section, shard, root, cfg)
        path = out_dir / f"{task['name']}.yaml"
        path.write_text(
            f"# written by `kvbench nightly --launch sky` for {section} {shard.tag} of night {fleet.night}\n"
            + yaml.dump(task, Dumper=dumper, sort_keys=False, width=1000)
        )
        written.append((path, task["name"], section, shard))
    write_atomic(out_dir / "plan.json", fleet.as_json())
    return written


# -- the budget ---------------------------------------------------------------------------------------------


def totals(fleet: Fleet) -> tuple[float, float | None]:
    """(GPU-hours, USD or None when a section has no price) of the whole night."""
    hours = sum(sp.gpu_hours for sp in fleet.shards.values())
    costs = [sp.usd() for sp in fleet.shards.values() if sp.gpus]
    return hours, (None if any(c is None for c in costs) else sum(costs))


def over_budget(fleet: Fleet, cfg: NightlyConfig) -> list[str]:
    """Why the night needs an explicit --yes: over a budget, or a USD budget no price can check."""
    hours, usd = totals(fleet)
    out = []
    if cfg.fleet.budget_gpu_hours is not None and hours > cfg.fleet.budget_gpu_hours:
        out.append(f"{hours:.2f} GPU-hours exceed [fleet] budget_gpu_hours {cfg.fleet.budget_gpu_hours:g}")
    if cfg.fleet.budget_usd is not None:
        if usd is None:
            out.append(f"[fleet] budget_usd {cfg.fleet.budget_usd:g} cannot be checked: a section has no price")
        elif usd > cfg.fleet.budget_usd:
            out.append(f"USD {usd:,.2f} exceeds [fleet] budget_usd {cfg.fleet.budget_usd:g}")
    return out


def over_deadline(fleet: Fleet) -> list[str]:
    """Shards whose estimate exceeds their section's max_minutes: refused outright, as a serial night is."""
    return [
        f"[machines.{k}] {s.tag} estimate {s.minutes:.1f} min exceeds max_minutes {fleet.plans[k].cfg.max_minutes:g}"
        for k, sp in fleet.shards.items()
        for s in sp.shards
        if s.minutes > fleet.plans[k].cfg.max_minutes
    ]


# -- SkyPilot -------------------------------------------------------------------------------------------------


def secrets(template: dict) -> dict[str, str]:
    """The template's secrets, from the environment: every one it names without a value must be set."""
    wanted = [k for k, v in (template.get("secrets") or {}).items() if v is None]
    missing = [k for k in wanted if not os.environ.get(k)]
    if missing:
        raise UsageError(
            f"{', '.join(missing)} not set: export {missing[0]} (sky/nightly.yaml names it a secret; it goes to "
            "SkyPilot from the environment, never into a file)"
        )
    return {k: os.environ[k] for k in wanted}


def sky_sdk():
    try:
        import sky
    except ImportError:
        sky = None
    if sky is None or not hasattr(sky, "Task"):  # this repo's sky/ folder imports as a namespace package
        raise UsageError(
            "SkyPilot is not installed: pip install 'skypilot[aws]==0.14.*' (or [gcp], [kubernetes], ...) "
            "and run `sky check`; the task files are written, nothing was submitted"
        )
    return sky


def submit(written, fleet: Fleet, secret_values: dict[str, str], sky=None) -> list[dict]:
    """Submit each task; [{section, shard, name, job_id | cluster}] as SkyPilot answers."""
    sky = sky or sky_sdk()
    out = []
    for path, name, section, shard in written:
        task = sky.Task.from_yaml(str(path))
        if secret_values:
            task.update_secrets(secret_values)
        row = {"section": section, "shard": shard.index, "name": name}
        try:
            if fleet.bucket:
                job_ids, _ = sky.get(sky.jobs.launch(task, name=name))
                row["job_id"] = (job_ids or [None])[0]
            else:
                request = sky.launch(task, cluster_name=name, idle_minutes_to_autostop=KEEP_MINUTES, down=True)
                row["job_id"], _ = sky.get(request)
                row["cluster"] = name
        except Exception as exc:  # one shard's failed submission is reported; the others still go
            row["error"] = f"{type(exc).__name__}: {exc}"
        out.append(row)
    return out


def _field(record, name):
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


def _status(record) -> str:
    status = _field(record, "status")
    return str(getattr(status, "value", status))


def wait(job_ids: list[int], timeout_s: float, progress, sky=None, poll_s: float = 60.0) -> dict[int, str]:
    """Poll the managed jobs until all have ended or timeout_s passes; jobs still running then are cancelled
    (they would be merged as missing anyway, and they cost money). job id -> final status."""
    sky = sky or sky_sdk()
    deadline = time.monotonic() + timeout_s
    statuses: dict[int, str] = {}
    while True:
        records = sky.get(sky.jobs.queue(refresh=True, job_ids=job_ids))
        statuses = {int(_field(r, "job_id")): _status(r) for r in records if _field(r, "job_id") in job_ids}
        running = [j for j in job_ids if statuses.get(j) not in TERMINAL]
        progress(statuses, running)
        if not running:
            return statuses
        if time.monotonic() >= deadline:
            sky.get(sky.jobs.cancel(job_ids=running))
            return {**statuses, **{j: f"{statuses.get(j, 'UNKNOWN')}, cancelled at the timeout" for j in running}}
        time.sleep(min(poll_s, max(1.0, deadline - time.monotonic())))


# -- fetching a bucket ------------------------------------------------------------------------------------


def download_argv(url: str, dest: Path) -> list[str]:
    if url.startswith("s3://"):
        return ["aws", "s3", "sync", "--only-show-errors", url, str(dest)]
    if url.startswith("gs://"):
        return ["gcloud", "storage", "rsync", "--recursive", url, str(dest)]
    raise UsageError(f"cannot fetch {url!r}; give s3://..., gs://... or a local folder")


def download(url: str, dest: Path, run=None) -> Path:
    """A bucket path's shard folders, copied into dest with the cloud's own CLI."""
    import shutil
    import subprocess

    argv = download_argv(url, dest)
    if run is None and shutil.which(argv[0]) is None:
        raise UsageError(f"fetching {url} needs the {argv[0]} CLI; install it, or copy the folder and merge it")
    dest.mkdir(parents=True, exist_ok=True)
    out = (run or subprocess.run)(argv, capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stderr or out.stdout or "").strip().splitlines()
        raise KvbenchError(f"{' '.join(argv[:3])} {url} failed: {tail[-1] if tail else f'exit {out.returncode}'}")
    return dest
