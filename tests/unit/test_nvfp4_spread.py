"""The NVFP4 cross-check's criterion (kernels/hf_nvfp4.judge) against the spread it is calibrated on
(tests/data/nvfp4_reference_spread.json, measured by scripts/nvfp4_reference_spread.py; issue 36): every
perturbed reference passes it, and the negative controls (a wrong digit, stopping early) fail it widely."""

from __future__ import annotations

import json

import pytest
from support import DATA

from kvbench.kernels import hf_nvfp4

SPREAD = json.loads((DATA / "nvfp4_reference_spread.json").read_text())


def test_the_data_says_how_it_was_measured():
    assert SPREAD["items"] == 40 and len(SPREAD["runs"]) >= 5 and "scripts/nvfp4_reference_spread.py" in SPREAD["how"]
    kinds = {r["perturbation"].split("-seed")[0] for r in SPREAD["runs"]}
    assert kinds == {"bf16-jitter", "eager-attention"}
    for r in SPREAD["runs"]:
        assert r["differing"] == len(r["gaps"])


@pytest.mark.parametrize("run", SPREAD["runs"], ids=lambda r: r["perturbation"])
def test_every_perturbed_reference_passes(run):
    ok, why = hf_nvfp4.judge(run["gaps"], SPREAD["items"], SPREAD)
    assert ok, why


@pytest.mark.parametrize("control", ["wrong_digit", "stop_early"])
def test_negative_controls_fail_widely(control):
    gaps = SPREAD["negative_controls"][control]["gaps"]
    ok, why = hf_nvfp4.judge(gaps, SPREAD["items"], SPREAD)
    assert not ok and why.startswith("40 of 40")
    allowed = int(why.split("allowed ")[1].split(":")[0])
    assert allowed <= SPREAD["items"] // 3  # 40 differing is far past what correct implementations show
    bound = hf_nvfp4.spread_bounds(SPREAD)["gap"]
    above = [g for g in gaps if g is not None and g > bound]
    assert len(above) >= 0.95 * len(gaps)  # one such answer alone already fails, nearly always


def test_one_broken_answer_among_equal_ones_fails_on_its_gap():
    worst_correct = hf_nvfp4.spread_bounds(SPREAD)["gap"]
    wrong = min(SPREAD["negative_controls"]["wrong_digit"]["gaps"])
    assert wrong > worst_correct
    assert not hf_nvfp4.judge([0.3, wrong], SPREAD["items"], SPREAD)[0]
    assert hf_nvfp4.judge([0.3, 0.7], SPREAD["items"], SPREAD)[0]  # near ties, as the Intel CI box showed
    assert hf_nvfp4.judge([2.0], SPREAD["items"], SPREAD)[0]  # issue 36's flake: correct, and now passes
