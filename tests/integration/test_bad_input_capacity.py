"""Bad numbers and bad model configs reach the user as one line and exit 2, through the CLI."""

import json

import pytest
from support import kvbench_here

from kvbench.core.datafiles import data_path

BASE = ["capacity", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-c", "4096"]
PLAN = ["plan", "-m", "llama-3.1-8b", "-u", "10", "-c", "4096", "--gpus", "h100-sxm"]


def one_line_exit_2(out, *needles):
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize("base", [BASE, PLAN], ids=["capacity", "plan"])
@pytest.mark.parametrize(
    "flag, value",
    [
        ("--kv-budget-gb", "nan"),
        ("--kv-budget-gb", "inf"),
        ("--kv-budget-gb", "0"),
        ("--kv-budget-gb", "-1"),
        ("--overhead-gb", "nan"),
        ("--overhead-gb", "inf"),
        ("--overhead-gb", "-1"),
        ("--gpu-memory-utilization", "nan"),
        ("--gpu-memory-utilization", "0"),
        ("--gpu-memory-utilization", "1.5"),
        ("--tensor-parallel-size", "0"),
        ("--pipeline-parallel-size", "-2"),
        ("--max-num-seqs", "0"),
        ("--max-num-batched-tokens", "0"),
        ("--weights", "fp6"),
        ("--vllm-version", "banana"),
    ],
)
def test_bad_numeric_flag_is_one_line(base, flag, value):
    one_line_exit_2(kvbench_here(*base, flag, value), flag.lstrip("-").split("-")[0])


def test_context_zero_is_rejected_not_defaulted():
    one_line_exit_2(kvbench_here("capacity", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-c", "0"), "--context")


def _config(tmp_path, **changes):
    cfg = json.loads(data_path("models/llama-3.1-8b.json").read_text())
    cfg.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    "field",
    [
        "num_key_value_heads",
        "num_hidden_layers",
        "hidden_size",
        "vocab_size",
        "num_attention_heads",
        "intermediate_size",
        "head_dim",
    ],
)
@pytest.mark.parametrize("value", [-8, 0, "8", True, 8.5])
def test_bad_config_value_is_one_line(tmp_path, field, value):
    out = kvbench_here("capacity", "-m", str(_config(tmp_path, **{field: value})), "-g", "h100-sxm", "-c", "64")
    one_line_exit_2(out, "config.json", f"'{field}'", repr(value), "positive integer")


@pytest.mark.parametrize(
    "field, value, form",
    [
        ("tie_word_embeddings", "yes", "true or false"),
        ("torch_dtype", 16, "a string"),
        ("layer_types", "full", "a list of strings"),
        ("quantization_config", [1], "a JSON object"),
    ],
)
def test_bad_config_type_is_one_line(tmp_path, field, value, form):
    out = kvbench_here("capacity", "-m", str(_config(tmp_path, **{field: value})), "-g", "h100-sxm", "-c", "64")
    one_line_exit_2(out, f"'{field}'", form)


def test_null_where_required_and_binary_config(tmp_path):
    one_line_exit_2(
        kvbench_here("capacity", "-m", str(_config(tmp_path, hidden_size=None)), "-g", "h100-sxm", "-c", "64"),
        "lacks 'hidden_size'",
    )
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    one_line_exit_2(kvbench_here("capacity", "-m", str(path), "-g", "h100-sxm", "-c", "64"), "not UTF-8")
