"""Hostile input, round four (issue 42): the POOR kinds of shared/notes/hostile-inputs-2026-12-06.md that are
not about a record's numbers or a server's logprobs, each one line (or a stated note) instead of a traceback,
a false reason or a silent default."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from support import committed_results, kvbench, kvbench_here

from kvbench import records
from kvbench.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
RUNS = committed_results() / "cpu-amd-epyc" / "runs"
DATA = ROOT / "kvbench" / "data"


def one_line(out, code: int = 2) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code and len(lines) == 1 and "Traceback" not in out.stderr, (out.returncode, out.stderr)
    return lines[0]


def test_a_record_without_config_says_so_instead_of_none(tmp_path):
    """3a_noconfig: never "model None ... None prompt + None output tokens; max_model_len None"."""
    doc = json.loads(sorted(RUNS.glob("*.json"))[-1].read_text())
    doc["config"] = {}
    path = tmp_path / "noconfig.json"
    path.write_text(json.dumps(doc))
    out = kvbench_here("report", path)
    assert out.returncode == 0 and "keeps no config" in out.stdout and "None prompt" not in out.stdout


def test_a_nightly_key_typo_is_named_with_its_fix(tmp_path):
    """7_unknown: `max_minuts` is named as the unknown key, with the key it should be."""
    text = (DATA / "nightly.toml").read_text()
    section = re.search(r"^\[machines\.[\w-]+\]$", text, re.M).group(0)
    body = text.split(section, 1)[1]
    key = re.search(r"^max_minutes\s*=", body, re.M)
    assert key, "the shipped nightly config sets max_minutes"
    broken = text.replace(
        section + body[: key.start()] + "max_minutes", section + body[: key.start()] + "max_minuts", 1
    )
    path = tmp_path / "nightly.toml"
    path.write_text(broken)
    line = one_line(kvbench_here("nightly", "--dry-run", "--config", path))
    assert "unknown key 'max_minuts'" in line and "did you mean 'max_minutes'" in line


def test_a_truncated_samples_file_is_named_not_missing(tmp_path):
    """K-P13: a truncated requests.parquet is one line naming it, never "not on this disk" or ArrowInvalid."""
    src = next(
        p for p in sorted(RUNS.glob("*.json")) if (json.loads(p.read_text()).get("samples") or {}).get("requests")
    )
    folder = tmp_path / "cpu-x" / "runs"
    folder.mkdir(parents=True)
    doc = json.loads(src.read_text())
    shutil.copy(src, folder / src.name)
    requests = folder / doc["samples"]["requests"]
    requests.write_bytes(b"PAR1" + bytes(3000))
    with pytest.raises(UsageError) as exc:
        records.samples_frame([folder / src.name])
    assert str(requests) in str(exc.value) and "damaged requests samples" in str(exc.value)


def _v1(tmp_path: Path, change) -> Path:
    """A project folder (asv.conf.json + results/) holding one odd kvbench.run/1 record."""
    shutil.copy(ROOT / "asv.conf.json", tmp_path / "asv.conf.json")
    runs = tmp_path / "results" / "cpu-x" / "runs"
    runs.mkdir(parents=True)
    doc = json.loads((ROOT / "tests" / "data" / "v1-record.json").read_text())
    path = runs / f"{doc['run_id']}.json"
    change(doc, path)
    path.write_text(json.dumps(doc))
    return path


def _requests_string(doc, path):
    doc["dtypes"][0]["phases"][0]["requests"] = "lots"


def _folder_for_parquet(doc, path):
    path.with_name(path.name.removesuffix(".json") + records.REQUESTS_SUFFIX).mkdir()


@pytest.mark.parametrize("dry", [True, False])
@pytest.mark.parametrize("change", [_requests_string, _folder_for_parquet])
def test_history_upgrade_of_an_odd_v1_record_is_named_never_a_traceback(tmp_path, change, dry):
    """N-P1: a phase whose requests are a string, a folder where requests.parquet goes; --dry-run writes
    nothing; a folder named like a record is not one."""
    path = _v1(tmp_path, change)
    (path.parent / "adir.json").mkdir()
    before = path.read_bytes()
    out = kvbench("history", "upgrade", *(["--dry-run"] if dry else []), cwd=tmp_path)
    assert "Traceback" not in out.stderr and str(path) in out.stdout, out.stderr[-2000:]
    if change is _requests_string or not dry:
        assert out.returncode == 1 and "left as" in out.stdout and path.read_bytes() == before
    else:
        assert out.returncode == 0 and "would be rewritten" in out.stdout and path.read_bytes() == before


def test_a_damaged_shard_manifest_is_named(tmp_path):
    """N-P2: shard.json that is not JSON: "cannot be merged: ...", not "found no shard folder"."""
    shard = tmp_path / "shards" / "2026-12-06" / "cpu" / "shard-1-of-2"
    shard.mkdir(parents=True)
    (shard / "shard.json").write_text("{not json")
    line = one_line(kvbench_here("nightly", "--merge", tmp_path / "shards", "--out", tmp_path / "site"))
    assert "cannot be merged" in line and str(shard) in line and "found no shard folder" not in line


@pytest.mark.parametrize("shards", ["100000", "1000000"])
def test_shards_are_bounded(shards):
    """N-P3: 10^5 and 10^6 shards ran past 60 s; now one line at once."""
    assert "give 1 to 1000" in one_line(kvbench_here("nightly", "--dry-run", "--shards", shards, "--gpu", "h100-sxm"))


def test_help_keeps_its_bracketed_words():
    """N-P7: "(default: [fleet] shards)", "[fleet]'s budget", "named [workloads.NAME] tables" as written."""
    nightly = kvbench("nightly", "--help").stdout
    run = kvbench("run", "--help").stdout
    assert "[fleet] shards" in nightly and "[fleet]'s budget" in nightly and "[workloads.NAME]" in run


def test_the_dry_run_refuses_the_machine_name_the_night_refuses():
    """N-P19: KVBENCH_MACHINE='../../../escaped-machine' with --dry-run: exit 2, as `--print machine`."""
    out = kvbench_here("nightly", "--dry-run", "--gpu", "cpu", env={"KVBENCH_MACHINE": "../../../escaped-machine"})
    assert "not a usable machine name" in one_line(out)


@pytest.mark.parametrize("value", ["1000000000", "99999999999999999999"])
def test_max_eval_items_beyond_the_tasks_is_refused(value):
    """N-P14: 10^9 broke fp8's second look inside lm-eval, 10^20 auto's whole eval; the tasks hold 500."""
    line = one_line(kvbench_here("run", "--max-eval-items", value))
    assert "--max-eval-items must be at most 500" in line


def _overlay(tmp_path: Path, name: str, edit) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    text = (DATA / name).read_text()
    (tmp_path / "data" / name).write_text(edit(text))
    return tmp_path / "data"


def _fp8(text: str, old: str, new: str) -> str:
    i = text.index("[formats.fp8]")
    j = text.index("\n[", i + 1)
    return text[:i] + text[i:j].replace(old, new, 1) + text[j:]


def _h100(text: str, pattern: str, new: str) -> str:
    i = text.index("[h100-sxm]")
    j = text.index("\n[", i + 1)
    return text[:i] + re.sub(pattern, new, text[i:j], count=1) + text[j:]


OVERLAYS = {
    # case: (file, edit, what the one line says)
    "dd_fmt_not_toml": ("formats.toml", lambda t: "foo bar\n", "not a readable TOML data file"),
    "dd_fmt_binary": ("formats.toml", lambda t: "\xa0\x89PNG", "not a readable TOML data file"),
    "dd_fmt_empty": ("formats.toml", lambda t: "", "no [formats] tables"),
    "dd_fmt_missing_databits": (
        "formats.toml",
        lambda t: _fp8(t, "data_bits = 8\n", ""),
        "lacks the field 'data_bits'",
    ),
    "dd_fmt_databits0": ("formats.toml", lambda t: _fp8(t, "data_bits = 8", "data_bits = 0"), "data_bits above 0"),
    "dd_fmt_databits_neg": ("formats.toml", lambda t: _fp8(t, "data_bits = 8", "data_bits = -8"), "data_bits above 0"),
    "dd_fmt_order_nan": ("formats.toml", lambda t: _fp8(t, "order = 3", "order = nan"), "needs a number `order`"),
    "dd_fmt_dup_order": ("formats.toml", lambda t: _fp8(t, "order = 3", "order = 0"), "each needs its own"),
    "dd_gpus_neg_mem": ("gpus.toml", lambda t: _h100(t, r"\nmemory_gb\s*=[^\n]+", "\nmemory_gb = -80"), "above 0"),
    "dd_gpus_nan_mem": (
        "gpus.toml",
        lambda t: _h100(t, r"\ndevice_memory_mib\s*=[^\n]+", "\ndevice_memory_mib = nan"),
        "[h100-sxm] holds a value kvbench cannot use",
    ),
    "dd_gpus_missing": ("gpus.toml", lambda t: _h100(t, r"\nmemory_gb\s*=[^\n]+", ""), "lacks the field 'memory_gb'"),
    "dd_models_missing": (
        "models.toml",
        lambda t: t.replace('config = "models/llama-3.1-8b.json"', 'config = "models/nope.json"', 1),
        "names config 'models/nope.json', which is not there",
    ),
}


@pytest.mark.parametrize("case", list(OVERLAYS))
def test_a_broken_data_overlay_is_one_line(tmp_path, case):
    """N-P12: $KVBENCH_DATA_DIR overlays that are not TOML, lack a field or hold an impossible value; even
    `kvbench --help` (which imports the registry) gives one line, never a traceback."""
    name, edit, said = OVERLAYS[case]
    overlay = _overlay(tmp_path, name, edit)
    env = {"KVBENCH_DATA_DIR": str(overlay)}
    out = kvbench("capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", "8192", env=env)
    line = one_line(out)
    assert said in line and str(overlay / name) in line, line
    if name == "formats.toml":  # --help works, or (where the registry breaks on import) says the same line
        shown = kvbench("--help", env=env)
        assert shown.returncode == 0 or one_line(shown) == line
