"""A vLLM config line read as far as it goes (kvbench/core/logconfig.py), and the lines around it that lie or break
(issue 41 part 1; issue 42's N-P15 and K-P8)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvbench.cli.app import app
from kvbench.core.logconfig import read_args_dict, read_engine_config
from kvbench.core.logparse import parse_startup_log

USER = Path(__file__).parents[1] / "data" / "vllm-user-logs"
HYBRID = Path(__file__).parents[1] / "data" / "vllm-hybrid-logs"
WHOLE = next(
    line.split("non-default args: ", 1)[1]
    for line in (USER / "club-3090-issue-294-qwen3.6-27b-int4-mtp3-2x3090-p2p-off.txt").read_text().splitlines()
    if "non-default args" in line
)


def test_the_whole_line_reads_as_python_reads_it():
    import ast

    read = read_args_dict(WHOLE)
    assert read.whole and read.values == ast.literal_eval(WHOLE) and not read.unreadable


@pytest.mark.parametrize("cut", range(1, len(WHOLE), 7))
def test_a_cut_line_gives_the_whole_lines_value_for_every_key_before_the_cut(cut):
    full = read_args_dict(WHOLE).values
    part = read_args_dict(WHOLE[:cut])
    assert not part.whole
    for key, value in part.values.items():
        assert full[key] == value, key
    # every key whose value ends (a ',' follows it) before the cut is read; none after
    ends = {k for k in full if f"'{k}': " in WHOLE[:cut] and WHOLE.index(f"'{k}': ") < cut}
    read = set(part.values)
    assert read <= ends
    assert len(ends - read) <= 1  # at most the pair the cut runs through


def test_a_value_that_is_no_literal_is_named_and_the_rest_read():
    read = read_args_dict("{'a': 1, 'mode': <CompilationMode.NONE: 0>, 'cfg': AttentionConfig(backend=None), 'b': 'x'}")
    assert read.whole and read.values == {"a": 1, "b": "x"} and read.unreadable == ["mode", "cfg"]
    dsv4 = parse_startup_log((USER / "vllm-issue-51454-deepseek-v4-flash-8xb200-dp8-args.txt").read_text())
    assert dsv4.args_line.cut and dsv4.args["kv_cache_dtype"] == "fp8" and dsv4.args["block_size"] == 256
    assert dsv4.args["data_parallel_size"] == 8 and dsv4.vllm_version == "0.25.0"


def test_the_engine_line_is_read_pair_by_pair():
    text = (USER / "club-3090-issue-642-qwen3.6-27b-int4-mtp3-2x3090.txt").read_text()
    log = parse_startup_log(text)
    cfg = log.engine_config
    assert cfg["tensor_parallel_size"] == 2 and cfg["kv_cache_dtype"] == "fp8_e5m2" and cfg["dtype"] == "float16"
    assert cfg["max_seq_len"] == 262144 and cfg["quantization"] == "inc" and cfg["disable_custom_all_reduce"] is True
    assert cfg["speculative_config"]["method"] == "mtp" and cfg["speculative_config"]["num_spec_tokens"] == 3
    assert not log.engine_line.whole and log.vllm_version == "0.24.0"
    # a bare value at the very end may be cut short: it is not read
    short = read_engine_config("model='m', tensor_parallel_size=2, max_seq_len=2621")
    assert short.values == {"model": "m", "tensor_parallel_size": 2} and not short.whole


def _from_log(tmp_path, text: str, *extra: str):
    path = tmp_path / "log.txt"
    path.write_text(text)
    return CliRunner().invoke(app, ["capacity", "--from-log", str(path), *extra], env={"COLUMNS": "250"})


CAPACITY = (
    "INFO [gpu_worker.py:1] Available KV cache memory: 11.05 GiB\n"
    "INFO [kv_cache_utils.py:1] GPU KV cache size: 623,873 tokens\n"
    "INFO [kv_cache_utils.py:2] Maximum concurrency for 262,144 tokens per request: 2.38x\n"
)


def test_the_output_lists_the_unseen_keys_with_the_values_assumed(tmp_path):
    text = "INFO non-default args: {'model': 'Qwen/Qwen3.5-27B', 'max_model_len': 262144, 'tensor_paral\n" + CAPACITY
    out = _from_log(tmp_path, text, "--gpu", "rtx-3090", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["args_line"]["last_key"] == "max_model_len" and not doc["args_line"]["whole"]
    assert {"tensor_parallel_size", "kv_cache_dtype", "speculative_config"} <= set(doc["assumed"])
    out = _from_log(tmp_path, text, "--gpu", "rtx-3090", "--tensor-parallel-size", "2")
    assert out.exit_code == 0, out.output
    assert "not in the log, assumed" in out.output and "kv_cache_dtype = auto" in out.output
    assert "flag --tensor-parallel-size" in out.output  # a flag is shown as given


@pytest.mark.parametrize("bad", ["1.2.3", "."])
def test_a_malformed_padding_line_is_named_not_a_traceback(tmp_path, bad):
    text = (HYBRID / "kvbench-tiny-qwen3-next-vllm-cpu-0.32-auto.txt").read_text()
    text = re.sub(r"Padding mamba page size by [\d.]+%", f"Padding mamba page size by {bad}%", text)
    out = _from_log(tmp_path, text, "--model", str(HYBRID / "kvbench-tiny-qwen3-next-config.json"), "--gpu", "h100-sxm")
    assert out.exit_code == 0, out.output
    assert "malformed line, not read" in out.output and bad in out.output


@pytest.mark.parametrize(
    "line",
    [
        "INFO GPU KV cache size: -1,198,372 tokens, Maximum concurrency for 2,048 tokens per request: 585.14x",
        "INFO GPU KV cache size: 1,198,372 tokens, Maximum concurrency for 2,048 tokens per request: nanx",
    ],
)
def test_a_malformed_capacity_line_is_called_malformed(tmp_path, capsys, line):
    from support import cli

    path = tmp_path / "log.txt"
    path.write_text(line + "\n")
    code, _, err = cli(capsys, "capacity", "--from-log", str(path), "--gpu", "h100-sxm")
    assert code == 2 and "malformed" in err and "no KV-cache capacity line" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_logs_model_name_reaches_the_terminal_without_escape_sequences(tmp_path):
    ref = (
        Path(__file__).parents[1]
        / "data"
        / "vllm-startup-logs"
        / "google-gemma-2-2b-it--h100-80gb--tp1pp1dp1--8192.txt"
    )
    text = ref.read_text().replace("google/gemma-2-2b-it", "\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[31mgemma")
    out = _from_log(tmp_path, text, "--model", "gemma-2-2b", "--gpu", "h100-sxm", "--vllm-version", "0.19.0")
    assert out.exit_code == 0, out.output
    assert "\x1b" not in out.output and "\x07" not in out.output and "gemma on NVIDIA H100" in out.output


def test_a_log_without_a_memory_line_and_without_gpu_names_the_choices(tmp_path):
    text = "INFO non-default args: {'model': 'Qwen/Qwen3.5-27B', 'max_model_len': 262144}\n" + CAPACITY
    out = _from_log(tmp_path, text)
    assert out.exit_code != 0
    message = str(out.exception)
    assert "does not say which GPU" in message and "--gpu NAME, one of:" in message and "rtx-4090" in message
    assert "None GiB" not in message
