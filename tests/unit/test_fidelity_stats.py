"""Fidelity math (kvbench/core/fidelity_stats.py): KL from full and top-k logprobs against torch on the tiny model's
own logits (auto vs NVFP4-rounded K/V), the clustered bootstrap, and the floor comparison."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvbench.core import fidelity_stats as fs


@pytest.fixture(scope="module")
def tiny_logprobs(trained_model):
    """log-softmax of the tiny model over one kvbench item, bf16 K/V vs NVFP4-rounded K/V: [positions, 512]."""
    import torch

    from kvbench.kernels import hf_nvfp4
    from kvbench.specs import evaltasks

    auto, tok = hf_nvfp4.load(trained_model, nvfp4_kv=False)
    nvfp4, _ = hf_nvfp4.load(trained_model, nvfp4_kv=True)
    item = evaltasks.generate("kvbench_needle_512", tok, 1)[0]
    ids = torch.tensor([tok.encode(item.prompt)])
    with torch.inference_mode():
        p = torch.log_softmax(auto(ids).logits[0].float(), -1)
        q = torch.log_softmax(nvfp4(ids).logits[0].float(), -1)
    return p, q


def _topk(row, k: int, extra: int) -> dict[int, float]:
    vals, idx = row.topk(k)
    out = {int(i): float(v) for v, i in zip(vals, idx, strict=True)}
    out[extra] = float(row[extra])  # vLLM adds the position's own token
    return out


def test_kl_full_and_topk_agree_with_torch_on_the_tiny_models_logits(tiny_logprobs):
    import torch

    p, q = tiny_logprobs
    assert p.shape[1] == 512
    direct = torch.nn.functional.kl_div(q, p, log_target=True, reduction="none").sum(-1).double().numpy()
    full = np.array([fs.kl_full(a.tolist(), b.tolist()) for a, b in zip(p, q, strict=True)])
    np.testing.assert_allclose(full, direct, rtol=1e-4, atol=1e-7)
    assert direct.mean() > 1e-4  # NVFP4 K/V moves the tiny model's distributions: the check is not vacuous
    topk = np.array([fs.kl_topk(_topk(a, 20, 0), _topk(b, 20, 0)) for a, b in zip(p, q, strict=True)])
    # a coarser partition never raises KL (a lower bound), up to float32 logprobs' rounding of the tail mass
    assert (topk <= full + 2e-6).all()
    # measured once here (needle item 0, 428 positions): top-20 + tail bucket recovers 84% of the exact KL
    assert 0.7 < topk.sum() / full.sum() <= 1.0
    # the whole vocabulary as "top-k": the bucketed form is the exact KL
    exact = np.array([fs.kl_topk(_topk(a, 512, 0), _topk(b, 512, 0)) for a, b in zip(p, q, strict=True)])
    np.testing.assert_allclose(exact, direct, rtol=1e-4, atol=1e-6)


def test_kl_topk_of_identical_distributions_is_zero_and_tail_counts():
    p = {1: math.log(0.5), 2: math.log(0.3)}
    assert fs.kl_topk(p, dict(p)) == 0.0
    q = {1: math.log(0.3), 2: math.log(0.3)}  # tails: p 0.2, q 0.4
    want = 0.5 * math.log(0.5 / 0.3) + 0.2 * math.log(0.2 / 0.4)
    assert fs.kl_topk(p, q) == pytest.approx(want)
    kld, agree, dlogp = fs.compare_position(p, q, 2)
    assert agree  # a tie goes to the first listed token on both sides
    assert dlogp == pytest.approx(0.0)


def _items(kld_per_item: list[list[float]], agree: bool = True) -> list[dict]:
    return [{"kld": k, "agree": [agree] * len(k), "dlogp": [0.0] * len(k)} for k in kld_per_item]


def test_summary_weighs_tokens_and_bootstraps_items_not_tokens():
    # one item with many large-KL tokens: a token bootstrap would call the mean precise, the item one must not
    items = _items([[1.0] * 50] + [[0.0] * 5] * 9)
    s = fs.summarize(items, "t")
    assert s["items"] == 10 and s["tokens"] == 95
    assert s["mean_kld"] == pytest.approx(50 / 95)
    lo, hi = s["mean_kld_ci"]
    assert lo == 0.0 and hi > 0.75  # a third of resamples miss the heavy item; some draw it 2-3 times
    assert s["top1_agreement"] == 1.0 and s["top1_agreement_ci"] == [1.0, 1.0]
    assert fs.summarize([], "t")["mean_kld"] is None


def test_no_measurable_change_needs_both_intervals_to_reach_the_floor():
    floor = {"mean_kld_ci": [0.0, 0.001], "top1_agreement_ci": [0.99, 1.0]}
    same = {"mean_kld_ci": [0.0005, 0.002], "top1_agreement_ci": [0.98, 0.995]}
    moved = {"mean_kld_ci": [0.01, 0.02], "top1_agreement_ci": [0.98, 0.995]}
    flipped = {"mean_kld_ci": [0.0, 0.0005], "top1_agreement_ci": [0.8, 0.9]}
    assert fs.no_measurable_change(same, floor)
    assert not fs.no_measurable_change(moved, floor)
    assert not fs.no_measurable_change(flipped, floor)
    assert not fs.no_measurable_change({"mean_kld_ci": None}, floor)
    assert not fs.no_measurable_change(same, {})


def _entry(kld, ci, agree, agree_ci, conc):
    return {"mean_kld": kld, "mean_kld_ci": ci, "p99_kld": 3 * kld, "top1_agreement": agree,
            "top1_agreement_ci": agree_ci, "items": 30, "tokens": 400, "concurrency": conc, "s_per_item": 0.1,
            "method": fs.METHOD_TOPK.format(k=20), "mean_gold_dlogp": -0.01}  # fmt: skip


def test_report_shows_each_dtype_beside_the_floor(capsys):
    from kvbench.cli.commands.report_fidelity import render_fidelity

    doc = {
        "dtypes": [
            {"kv_cache_dtype": "auto", "fidelity": {"load": _entry(0.0, [0.0, 0.0], 1.0, [1.0, 1.0], 16)}},
            {"kv_cache_dtype": "fp8", "fidelity": {"rest": _entry(0.0, [0.0, 0.0], 1.0, [1.0, 1.0], 1)}},
            {"kv_cache_dtype": "nvfp4", "fidelity": {"load": _entry(4e-4, [2e-4, 8e-4], 0.99, [0.98, 1.0], 16)}},
            {"kv_cache_dtype": "old", "fidelity": None},
        ]
    }
    render_fidelity(doc)
    out = capsys.readouterr().out
    assert "Fidelity per token" in out and "lower bound on KL" in out
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("│") and "(c" in line}
    assert "the floor" in lines["auto"] and "no measurable change" in lines["fp8"]
    assert (
        "above the floor" in lines["nvfp4"]
        and "4.0e-04 [2.0e-04, 8.0e-04]" in lines["nvfp4"]
        and "99.0% [98.0, 100.0]" in lines["nvfp4"]
    )
    render_fidelity({"dtypes": [{"kv_cache_dtype": "auto"}]})
    assert capsys.readouterr().out == ""


def test_quality_page_section_plots_each_dtype_against_the_floor(tmp_path):
    from kvbench.dashboards.components import Page
    from kvbench.dashboards.data import SiteData
    from kvbench.dashboards.fidelity_view import fidelity_section

    doc = {
        "machine": "box",
        "run_id": "r1",
        "created_at": "2026-12-05T00:00:00+00:00",
        "dtypes": [
            {"kv_cache_dtype": "auto", "fidelity": {"load": _entry(0.0, [0.0, 0.0], 1.0, [1.0, 1.0], 16)}},
            {"kv_cache_dtype": "nvfp4", "fidelity": {"rest": _entry(4e-4, [2e-4, 8e-4], 0.99, [0.98, 1.0], 1)}},
        ],
    }
    page = Page("quality", "Quality")
    assert fidelity_section(page, SiteData(results_dir=tmp_path)) is None  # no run measured it: no section
    html = fidelity_section(page, SiteData(results_dir=tmp_path, records=[doc]))
    assert 'id="fidelity"' in html and "above the floor" in html and "4.00e-04 [2.0e-04, 8.0e-04]" in html
    (div, fig), *_ = page.figures
    assert div == "fidelity-box-0" and [t.name for t in fig.data] == ["auto", "nvfp4"]


def test_regress_treats_fidelity_like_the_other_tracked_metrics():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_regress import frame

    from kvbench.analysis.regress import find_regressions
    from kvbench.records import headline
    from kvbench.specs.tracked import by_name

    m = by_name()
    assert m["fidelity_kld_rest"].direction == "lower" and m["fidelity_top1_rest"].direction == "higher"
    numbers = headline({"fidelity": {"rest": _entry(4e-4, [2e-4, 8e-4], 0.99, [0.98, 1.0], 1)}})
    assert numbers["fidelity_kld_rest"] == 4e-4 and numbers["fidelity_top1_rest"] == 0.99
    assert numbers["fidelity_kld_load"] is None  # not measured: asv records n/a
    series = {
        ("fidelity_kld_rest", "nvfp4"): [4e-4] * 5 + [8e-4],  # a kernel change doubles the KLD
        ("fidelity_kld_rest", "fp8"): [4e-4] * 5 + [2e-4],
        ("fidelity_top1_load", "nvfp4"): [0.99] * 5 + [0.95],
        ("fidelity_top1_load", "fp8"): [0.99] * 5 + [0.992],  # inside the noise
    }
    got = {(r.metric, r.kv_dtype): r.verdict for r in find_regressions(frame(series))}
    assert got[("fidelity_kld_rest", "nvfp4")] == "regression" and got[("fidelity_kld_rest", "fp8")] == "improvement"
    assert got[("fidelity_top1_load", "nvfp4")] == "regression" and got[("fidelity_top1_load", "fp8")] == "unchanged"
