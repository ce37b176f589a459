"""The kvbench command as a user runs it: help on every subcommand, JSON, one-line errors, exit codes."""

import json

import pytest
from support import kvbench_here


def run(*args, check=False):
    out = kvbench_here(*args)
    assert out.returncode == 0 or not check, out.stderr
    return out


SUBCOMMANDS = ["capacity", "claims", "plan", "eval"]


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_help_on_each_subcommand(sub):
    out = run(sub, "--help")
    assert out.returncode == 0 and "--" in out.stdout


def test_top_level_help_lists_subcommands():
    out = run("--help")
    assert all(sub in out.stdout for sub in SUBCOMMANDS)


def test_capacity_json():
    out = run(
        "capacity", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-c", "4096", "--kv-budget-gb", "56", "--json", check=True
    )
    doc = json.loads(out.stdout)
    users = {r["dtype"]: r["users"] for r in doc["rows"]}
    assert users == {"auto": 104, "fp8": 208, "nvfp4": 370}


def test_capacity_table_states_units():
    out = run("capacity", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-c", "4096", check=True)
    assert "GB" in out.stdout and "GiB" in out.stdout and "naive" in out.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["capacity", "-m", "nope", "-g", "h100-sxm", "-c", "1"], "choose from: codellama-7b, deepseek-v2-lite"),
        (["capacity", "-m", "llama-3.1-8b", "-g", "h900", "-c", "1"], "choose from: a10, a100-40gb"),
        (["capacity", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-c", "1", "--kv-dtype", "fp3"], "choose from: auto"),
        (["plan", "-m", "llama-3.1-8b", "-u", "5", "-c", "10", "--gpus", "h100,h200"], "choose from: a10, a100-40gb"),
        (
            [
                "capacity",
                "-m",
                "llama-3.1-8b",
                "-g",
                "h100-sxm",
                "-c",
                "1",
                "--kv-budget-gb",
                "5",
                "--gpu-memory-utilization",
                "0.5",
            ],
            "not both",
        ),
        (["frobnicate"], "choose from: accuracy, capacity, claims, "),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    out = run(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_malformed_config_names_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2}))
    out = run("capacity", "-m", str(tmp_path), "-g", "h100-sxm", "-c", "64")
    assert out.returncode == 2 and "num_hidden_layers" in out.stderr


def test_claims_strict_exits_1_on_failures():
    assert run("claims").returncode == 0
    out = run("claims", "--strict")
    assert out.returncode == 1 and "fails" in out.stdout


def test_claims_json_has_every_claim():
    doc = json.loads(run("claims", "--json", check=True).stdout)
    assert {"claimed", "derived", "verdict", "derivation"} <= set(doc["claims"][0])


def test_plan_with_prices():
    out = run(
        "plan",
        "-m",
        "llama-3.1-8b",
        "-u",
        "400",
        "-c",
        "4096",
        "--gpus",
        "h100-sxm",
        "--price-per-hour",
        "h100-sxm=2.65",
        "--json",
        check=True,
    )
    rows = json.loads(out.stdout)["rows"]
    assert all(r["usd_per_hour"] == pytest.approx(r["gpus"] * 2.65) for r in rows)
