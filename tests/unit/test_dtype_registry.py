"""kvbench/data/formats.toml is the one KV-dtype registry: a fake dtype added to a COPY of it (through
$KVBENCH_DATA_DIR, kvbench.core.datafiles) reaches the capacity table, the run record, the verdict's order and a
dashboard page with no other change. The views of the shipped registry keep the orders they had."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest

from kvbench.analysis import verdict
from kvbench.core import datafiles
from kvbench.core.errors import UsageError
from kvbench.core.units import GB
from kvbench.records import parse_record, read_record, write_record
from kvbench.specs import formats
from kvbench.specs.capacity import budget_from_bytes, capacity_table
from kvbench.specs.models import load_model

# 6-bit values + one 8-bit scale per 32: 0.75 + 1/32 = 0.78125 B per element; vLLM does not know it
FAKE = """
[formats.fp6_test]
description = "a fake 6-bit format with one 8-bit scale per 32 values (test only)"
vllm_dtypes = ["fp6_test"]
aliases = ["fp6t"]
data_bits = 6
scale_bits = 8
scale_block = 32
article_bytes_per_element = 0.75
order = 4.5
color = "#F0E442"
marker = "cross"
source = "tests/unit/test_dtype_registry.py"
"""


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """A copy of the shipped registry with fp6_test added, in force through $KVBENCH_DATA_DIR. load_toml caches
    per resolved path, so nothing needs clearing: the copy's path is new, and unsetting the variable brings
    back the shipped file's cached parse."""
    shipped = datafiles.data_path("formats.toml").read_text()
    (tmp_path / "formats.toml").write_text(shipped + FAKE)
    monkeypatch.setenv(datafiles.ENV_DATA_DIR, str(tmp_path))
    yield tmp_path
    monkeypatch.delenv(datafiles.ENV_DATA_DIR)
    assert "fp6_test" not in formats.catalog() and "fp6_test" not in formats.dtype_order()


def test_the_shipped_registry_keeps_its_orders_and_lists():
    assert formats.dtype_order()[:8] == ("auto", "fp16", "bf16", "fp8", "fp8_e5m2", "nvfp4", "nvfp4_4over6", "mxfp4")
    assert formats.tracked_dtypes() == ("auto", "fp8", "nvfp4")  # the asv parameter
    assert formats.speed_kernels() == ("fp16", "fp8", "nvfp4")
    assert formats.accuracy_variants() == {"auto": ("bf16", "-"), "fp8": ("fp8", "1"), "nvfp4": ("nvfp4", "1")}
    assert formats.kernel_formats("cache_kernel") == ("fp16", "bf16", "fp8", "fp8_e5m2", "nvfp4")
    assert formats.kernel_formats("accuracy_study")[-2:] == ("nvfp4_4over6", "mxfp4")
    orders = [formats.order_key(d)[0] for d in formats.dtype_order()]
    assert len(set(orders)) == len(orders)  # one place each: a tie would make the order depend on the file
    assert "fp16" not in formats.catalog() and formats.get_format("fp16").key == "auto"  # kernel-only keys


def test_a_fake_dtype_reaches_the_capacity_table(fake_registry):
    llama = load_model("llama-3.1-8b")
    auto, fake, nvfp4 = capacity_table(
        llama, formats.parse_format_list("auto,fp6t,nvfp4"), 4096, budget_from_bytes(56 * GB)
    )
    assert (fake.dtype, fake.vllm_dtype, fake.supported) == ("fp6_test", "fp6_test", True)
    assert fake.bytes_per_element == 0.78125
    assert fake.bytes_per_user == 4096 * 32 * 2 * 8 * 128 * 0.78125  # tokens x layers x K,V x heads x dim
    assert nvfp4.users > fake.users > auto.users


def test_a_fake_dtype_reaches_the_capacity_command(fake_registry):
    from typer.testing import CliRunner

    from kvbench.cli.app import app

    args = ["capacity", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-c", "4096", "--kv-dtype", "auto,fp6_test", "--json"]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert [r["dtype"] for r in json.loads(out.stdout)["rows"]] == ["auto", "fp6_test"]


def _record(*names: str, tps: float = 1000.0):
    """A run record where every dtype answered alike and ran alike fast: eligible, and tied on speed."""
    summary = {"completed": 10, "output_throughput_tps": tps}
    answers = {"metric": "exact_match,exact", "n": 500, "correct": 500, "accuracy": 1.0}
    ok = {
        "status": "ok",
        "kv_dtype_confirmed": True,
        "capacity": {},
        "phases": [{"name": "fixed", "kind": "fixed", "concurrency": 16, "summary": summary}],
    }
    paired = {**answers, "vs_auto": {"n": 500, "losses": 0, "gains": 0, "difference": 0.0}}
    evals = {n: {"rest": {"concurrency": 1, "tasks": {"t": answers if n == "auto" else paired}}} for n in names}
    return parse_record(
        {
            "schema": "kvbench.run/2",
            "run_id": "r",
            "created_at": "2026-12-01T00:00:00+00:00",
            "machine": "m",
            "config": {"eval": {"budget_points": 1.0, "budgets": {}, "confidence": 0.95}},
            "environment": {"gpus": []},
            "dtypes": [{"kv_cache_dtype": n, **ok, "eval": evals[n]} for n in names],
            "findings": [],
        }
    )


def test_a_fake_dtype_round_trips_through_the_record(fake_registry):
    rec = _record("auto", "fp6_test")
    again = read_record(write_record(fake_registry / "run.json", rec))
    assert again.dtype("fp6_test") is not None and again.as_doc() == rec.as_doc()


def test_a_fake_dtype_takes_its_place_in_the_verdicts_order(fake_registry):
    # 6 data bits: after fp8's 8, before nvfp4's 4; among equal bits the registry's order decides
    got = sorted(["nvfp4", "fp6_test", "mxfp4", "auto", "fp8"], key=verdict.precision_key)
    assert got == ["auto", "fp8", "fp6_test", "nvfp4", "mxfp4"]
    decision = verdict.decide(_record("nvfp4", "fp6_test", "auto"))  # all tied: the most precise keeps it
    assert decision.recommended == "auto" and "tie with fp6_test, nvfp4" in decision.why, decision.why


def test_a_fake_dtype_gets_its_look_and_place_on_a_page(fake_registry):
    from kvbench.dashboards import page_capacity, theme

    assert (theme.color("fp6_test"), theme.symbol("fp6_test"), theme.dash("fp6_test")) == ("#F0E442", "cross", "solid")
    assert theme.ordered(["nvfp4", "fp6_test", "auto", "fp8_e5m2"]) == ["auto", "fp8_e5m2", "fp6_test", "nvfp4"]
    block = {"model": {"budget_bytes": 8 * GB, "block_size": 16, "context": 4096}}
    doc = {
        "run_id": "r",
        "created_at": "2026-12-01T00:00:00+00:00",
        "config": {"model_name": "llama-3.1-8b"},
        "dtypes": [{"kv_cache_dtype": d, "capacity": block} for d in ("nvfp4", "fp6_test", "auto")],
    }
    lines, why = page_capacity.model_lines(doc)
    assert why is None
    runs = pd.DataFrame(
        columns=["run_id", "kv_cache_dtype", "context", "engine_max_concurrency", "measured_max_concurrency"]
    )
    fig = page_capacity.capacity_figure(doc, lines, runs)
    traces = [t for t in fig.data if t.legendgroup]
    assert [t.legendgroup for t in traces] == ["auto", "fp6_test", "nvfp4"]
    assert traces[1].line.color == "#F0E442"


def test_an_unknown_dtype_names_the_fake_one_among_the_choices(fake_registry):
    with pytest.raises(UsageError, match="fp6_test"):
        formats.get_format("fp7")


def test_the_default_run_on_each_backend_runs_every_tracked_dtype():
    # asv's history points are default `kvbench run`s: a tracked dtype they skip would be a hole in every history
    run_defaults = datafiles.load_toml("run_defaults.toml")
    for backend in ("cpu", "gpu"):
        assert set(formats.tracked_dtypes()) <= set(run_defaults[backend]["kv_dtypes"]), backend


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("order = 4.5\n", ""), r"\[formats.fp6_test\] needs a number `order`"),
        (lambda t: t.replace("order = 4.5", "order = 5"), r"\[formats.fp6_test\] has order 5, already nvfp4's"),
        (lambda t: t.replace("order = 4.5", "order = 4.5\ntracked = true"), r"is tracked, so it needs `speed_kernel`"),
        (
            lambda t: t.replace("order = 4.5", 'order = 4.5\nspeed_kernel = "fp6_test"'),
            r"kernel key 'fp6_test', which has no `cache_kernel = true` entry",
        ),
    ],
)
def test_a_broken_registry_entry_is_one_line_naming_it(tmp_path, monkeypatch, edit, message):
    shipped = datafiles.data_path("formats.toml").read_text()
    (tmp_path / "formats.toml").write_text(shipped + edit(FAKE))
    monkeypatch.setenv(datafiles.ENV_DATA_DIR, str(tmp_path))
    with pytest.raises(UsageError, match=message) as err:
        formats.dtype_order()
    assert "\n" not in str(err.value)


# Fake numerics for fp6_test, in a module of the test's own (not kvbench.kernels): 6-bit symmetric integers per
# head row, times a tensor scale. The registry entry names it (`numerics = "fakenumerics.fp6"`, a dotted name is
# imported as written), and importing it registers the codec, as a numerics module in kernels/ does.
FAKE_NUMERICS = """
import torch

from kvbench.kernels import codecs

CALLS = {"round_trip": 0}


def round_trip(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    CALLS["round_trip"] += 1
    y = x.float() / scale
    step = y.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 31
    return (torch.round(y / step) * step * scale).to(torch.float32)


CODEC = codecs.register(
    codecs.Codec(
        key="fp6_test",
        quant_dequant=round_trip,
        scaled=True,
        calibrated_scale=lambda x: float(x.abs().max()) / 31,
    )
)
"""


@pytest.fixture
def fake_numerics(tmp_path, monkeypatch):
    """fake_registry's fp6_test with numerics of its own, in the accuracy study: a registry copy and a numerics
    module outside kvbench, nothing else."""
    package = tmp_path / "fakenumerics"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fp6.py").write_text(FAKE_NUMERICS)
    monkeypatch.syspath_prepend(str(tmp_path))
    shipped = datafiles.data_path("formats.toml").read_text()
    (tmp_path / "formats.toml").write_text(shipped + FAKE + 'numerics = "fakenumerics.fp6"\naccuracy_study = true\n')
    monkeypatch.setenv(datafiles.ENV_DATA_DIR, str(tmp_path))
    yield tmp_path
    from kvbench.kernels import codecs

    codecs._REGISTRY.pop("fp6_test", None)  # the process's other tests see the shipped registry only
    for name in [m for m in sys.modules if m.split(".")[0] == "fakenumerics"]:
        del sys.modules[name]
    monkeypatch.delenv(datafiles.ENV_DATA_DIR)


def test_a_fake_dtype_with_its_own_numerics_reaches_the_accuracy_study(fake_numerics):
    import torch

    from kvbench.kernels import accuracy as acc

    assert "fp6_test" in acc.formats()
    assert [v.label for v in acc.variants(["fp6_test"])] == ["fp6_test (scale amax)", "fp6_test (scale 1)"]
    shape = acc.SyntheticShape(num_kv_heads=2, group=2, head_dim=32, context=64, queries=2)
    rows = acc.synthetic_study(acc.variants(["fp6_test", "nvfp4"], ["1"]), shape, ["gaussian"])
    fake = next(r for r in rows if r["format"] == "fp6_test")
    # the study's K error is the fake codec's own round trip, not another format's
    from fakenumerics import fp6

    _, k, _ = acc.synthetic_kv("gaussian", shape)
    expected = float((fp6.round_trip(k).double() - k.double()).norm() / k.double().norm())
    assert fake["k_rel_l2"] == pytest.approx(expected, rel=1e-12)
    assert 0 < fake["rel_l2"] < next(r for r in rows if r["format"] == "nvfp4")["rel_l2"]
    assert torch.equal(acc.quant_dequant(acc.Variant("fp6_test", "1"), k), fp6.round_trip(k))


def test_a_fake_dtype_with_its_own_numerics_reaches_the_scorer(fake_numerics):
    import torch

    from kvbench.specs import evaltasks
    from kvbench.tinymodel import build, scoring

    assert "fp6_test" in scoring.scored_dtypes()
    x = torch.randn(1, 2, 5, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    from fakenumerics import fp6

    assert torch.equal(scoring.fake_quant(x, "fp6t"), fp6.round_trip(x, scale=1.0).to(torch.bfloat16))  # alias
    model, tok = scoring.load(build.committed_dir())
    items = evaltasks.generate("kvbench_needle_512", tok, 3)
    before = fp6.CALLS["round_trip"]
    score = scoring.score_items(model, tok, "kvbench_needle_512", items, "fp6_test")
    assert (score.kv_dtype, score.n) == ("fp6_test", 3)
    assert fp6.CALLS["round_trip"] > before  # every layer's K and V went through the fake numerics
    with pytest.raises(UsageError, match="choose from: auto, fp8, nvfp4 \\(tracked\\), or .*fp6_test"):
        scoring.fake_quant(x, "fp7")


def test_every_cache_kernel_format_has_a_kernel_layout():
    # the Triton kernels' formats (formats.toml `cache_kernel`) are one table, kernels/cache_layouts.py
    from kvbench.kernels.cache_layouts import LAYOUTS

    assert set(formats.kernel_formats("cache_kernel")) == set(LAYOUTS)
    codes = {key: layout.code for key, layout in LAYOUTS.items()}
    assert len(set(codes.values())) == len(codes) - 1 and codes["fp16"] == codes["bf16"]  # 16-bit: one branch


def test_a_cache_kernel_entry_without_a_kernel_layout_is_named(fake_registry, monkeypatch):
    pytest.importorskip("triton")
    from kvbench.kernels import paged_cache

    text = (fake_registry / "formats.toml").read_text() + "cache_kernel = true\n"
    (fake_registry / "formats.toml").write_text(text)
    with pytest.raises(ValueError, match="marks 'fp6_test' cache_kernel, but kernels/cache_layouts.py has no layout"):
        paged_cache.allocate("fp6_test", 1, 1, 16)
