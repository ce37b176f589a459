"""What the asv suite measures, as library code (benchmarks/ only wraps it): one `kvbench run` per asv
history point for the serving metrics, and a deterministic attention-accuracy study.

Both return plain dicts ({kv_dtype: {field: number or None}}) so asv can pickle them from `setup_cache`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvbench.specs.formats import accuracy_variants
from kvbench.specs.tracked import KV_DTYPES

# Environment the `kvbench history run` wrapper sets for the benchmark processes. asv passes the calling
# environment through (minus PYTHONPATH) but gives benchmarks none of its ASV_* variables (asv 0.6.6 only
# interpolates them into build commands), so a plain `asv run` falls back to what the files say.
ENV_COMMIT = "KVBENCH_ASV_COMMIT"
ENV_ENV_NAME = "KVBENCH_ASV_ENV"
ENV_RESULTS = "KVBENCH_RESULTS"
ENV_MACHINE = "KVBENCH_MACHINE"  # also read by kvbench.specs.machine.machine_name
ENV_MODEL = "KVBENCH_MODEL"  # the model on GPU machines (the CPU default needs none)
# the real pretrained model of the asv RealModel series (kvbench/data/realmodels.toml); KVBENCH_REAL_MODEL changes it
REAL_MODEL = os.environ.get("KVBENCH_REAL_MODEL", "smollm2-135m-instruct")

# The accuracy track: KV dtype -> (kvbench.kernels.accuracy format, tensor-scale convention). "auto" is
# bf16, the dtype of the tiny CPU model and of most checkpoints. Scale "1" is what vLLM uses for fp8 and
# nvfp4 when the checkpoint carries no calibrated scales, i.e. what `--kv-cache-dtype` alone gives.
ACCURACY_VARIANTS = accuracy_variants()  # formats.toml `accuracy_variant` of each tracked dtype
ACCURACY_DATA = "gaussian"  # seed 0, Llama-3.1-8B attention shape at 4K context: ~10 s on 2 cores


def results_dir(root: Path) -> Path:
    """Where the asv run's results live (absolute: benchmarks run in a temporary working directory):
    $KVBENCH_RESULTS, else `results_dir` of <root>/asv.conf.json (root = the folder above benchmarks/)."""
    if os.environ.get(ENV_RESULTS):
        return Path(os.environ[ENV_RESULTS]).absolute()
    try:
        conf = json.loads((root / "asv.conf.json").read_text())
    except (OSError, ValueError):
        conf = {}
    return (root / conf.get("results_dir", "results")).absolute()


def _git_head(repo: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


CODE_DIRS = ("kvbench", "harness", "kernels", "benchmarks")


def changed_code(repo: Path) -> list[str]:
    """Tracked files of the code the benchmarks run that differ from HEAD (a point claims HEAD's code)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_DIRS],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line[3:] for line in out.stdout.splitlines() if len(line) > 3]


def _existing_env_name(python: str) -> str:
    """asv's name for an existing environment run by this interpreter path (see
    kvbench.orchestration.asvrun.env_name)."""
    from asv.environment import get_env_name

    return get_env_name("existing", python.replace(os.path.sep, "_"), {}, {})


def asv_link(root: Path) -> dict:
    """What ties a run record to its asv history point: the commit asv keys it by and the env name.
    Without the wrapper's variables: HEAD (what `asv run --set-commit-hash HEAD` keys to) and the name
    asv gives an existing environment of this interpreter."""
    return {
        "commit": os.environ.get(ENV_COMMIT) or _git_head(root),
        "env_name": os.environ.get(ENV_ENV_NAME) or _existing_env_name(sys.executable),
        "python": sys.executable,
        "uncommitted_code": changed_code(root),  # what ran differed from the commit in these files
    }


def serving_numbers(root: Path, model: str | None = None) -> dict:
    """Run ONE `kvbench run` with the machine's defaults (SLO search on, unknown dtypes recorded as
    unsupported) and return {"run_id", "record", "dtypes": {dtype: {"status", **headline}}}.

    root: the asv project folder (above benchmarks/). The record goes to <results>/<machine>/runs/ like any
    `kvbench run`, with an "asv" block linking it to the history point."""
    from kvbench.harness.run.runplan import RunOptions
    from kvbench.harness.server.vllm_info import accepted_kv_dtypes
    from kvbench.orchestration.measure import execute

    plan = _suite_plan(root, model)  # the SLO search (on by default) with the machine's default objective
    extra = {
        "asv": asv_link(root),
        # which --kv-cache-dtype values this vLLM accepts: releases differ in it, and the tracked three are a subset
        "vllm_kv_dtypes": list(accepted_kv_dtypes(sys.executable)),
        # other work on the box distorts every latency: the record says how busy it was (1/5/15-min load averages)
        "host_load": {"cpus": os.cpu_count(), "before": list(os.getloadavg())},
    }

    def after(record):
        record.host_load["after"] = list(os.getloadavg())

    # asv's timeout terminates us: execute() turns SIGTERM into a clean stop and keeps the partial record
    record, path = execute(plan, options=RunOptions(extra=extra, on_finish=after))
    doc = record.as_doc()
    return {"run_id": doc["run_id"], "record": str(path), "status": doc["status"], "dtypes": _tracked(doc)}


def _suite_plan(root: Path, model: str | None, **values):
    """The plan of a suite run: this machine's defaults and the tracked dtypes (one not accepted is recorded as
    unsupported), the record under the asv results folder and machine, and `values` on top."""
    from kvbench.harness.run.realplan import build_plan
    from kvbench.harness.run.settings import RunSettings
    from kvbench.specs.machine import nvml_gpus

    gpus, _ = nvml_gpus()
    return build_plan(
        RunSettings.for_machine(
            bool(gpus),
            model=model or os.environ.get(ENV_MODEL) or None,
            kv_dtypes=list(KV_DTYPES),
            unknown_dtypes="record",
            results_dir=results_dir(root),
            python=sys.executable,
            machine=os.environ.get(ENV_MACHINE) or None,  # `kvbench history run` names the asv machine
            **values,
        )
    )


def _tracked(doc: dict) -> dict:
    """{dtype: {"status", "emulated", **headline}} as the asv tracks read them: an emulated dtype's speed numbers
    are blanked, so its speed series stay n/a and never reach `kvbench regress`."""
    from kvbench.records import headline, representative

    return {
        d["kv_cache_dtype"]: {
            "status": d["status"],
            "emulated": bool(d.get("emulated")),
            **representative(headline(d), bool(d.get("emulated"))),
        }
        for d in doc["dtypes"]
    }


def prefix_numbers(root: Path, model: str | None = None) -> dict:
    """Run the prefix-cache scenario once (kvbench/data/workloads.toml "prefix-cache", its fixed load only) and
    return {"dtypes": {dtype: {"status", **headline}}}: hit rate and TTFT per dtype."""
    from kvbench.harness.run.runplan import RunOptions
    from kvbench.orchestration.measure import execute

    plan = _suite_plan(
        root, model, no_search=True, workload="prefix-cache", concurrency=[8], sweep=False, eval_tasks=[]
    )
    record, path = execute(plan, options=RunOptions(extra={"asv": asv_link(root)}))
    return {"record": str(path), "dtypes": _tracked(record.as_doc())}


def accuracy_numbers() -> dict:
    """{dtype: {"rel_l2", "cos_mean", ...}}: attention output vs fp32 with K/V stored in each KV dtype, on
    seeded synthetic K/V (deterministic: the same numbers on every run with the same torch)."""
    from kvbench.kernels import accuracy

    shape = accuracy.SyntheticShape()
    q, k, v = accuracy.synthetic_kv(ACCURACY_DATA, shape)
    ref = accuracy.attention(q, k, v)
    return {
        dtype: accuracy.evaluate(accuracy.Variant(fmt, scale), q, k, v, ref)
        for dtype, (fmt, scale) in ACCURACY_VARIANTS.items()
    }
