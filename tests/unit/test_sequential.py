"""kvbench.core.sequential: the boundaries spend exactly the stated Lan-DeMets O'Brien-Fleming-type alpha, checked by
simulating the canonical joint normal and by the rule's stopping on constructed counts."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from kvbench.core import noninferiority as ni
from kvbench.core import sequential as seq


def test_spending_function_is_obrien_fleming_type():
    assert seq.spent(1.0, 0.05) == pytest.approx(0.05)
    assert seq.spent(0.5, 0.05) == pytest.approx(2 - 2 * norm.cdf(norm.ppf(0.975) / 0.5**0.5))
    assert seq.spent(0.25, 0.05) < seq.spent(0.5, 0.05) < seq.spent(0.75, 0.05) < 0.05


def test_boundaries_spend_the_stated_alpha_at_every_look():
    fractions = [0.25, 0.5, 0.75, 1.0]
    c = seq.boundaries(fractions, 0.05)
    assert c[0] > c[1] > c[2] > c[3] > norm.ppf(0.95)  # early looks need more; the last near the fixed z
    assert c[0] == pytest.approx(norm.ppf(1 - seq.spent(0.25, 0.05)))
    # simulate score statistics on the null: Z_k = W(t_k) / sqrt(t_k), W a Brownian motion
    rng = np.random.default_rng(3)
    steps = rng.standard_normal((400_000, 4)) * np.sqrt(np.diff([0.0, *fractions]))
    z = np.cumsum(steps, axis=1) / np.sqrt(fractions)
    crossed = np.maximum.accumulate(z >= np.array(c), axis=1)
    for k, t in enumerate(fractions):
        assert crossed[:, k].mean() == pytest.approx(seq.spent(t, 0.05), abs=1.2e-3)


def test_the_rule_stops_at_the_first_decision_and_records_every_look():
    planned = [200, 400, 600, 800]
    # no discordant pair: T(-1 point) grows as sqrt(n m / (1 - m)): 1.42, 2.01, 2.46, 2.84
    counts = [(0, 0, n) for n in planned]
    looks = seq.run(counts, planned, 0.01, 0.05)
    bounds = seq.boundaries([0.25, 0.5, 0.75, 1.0], 0.05)
    expect = next(k for k, n in enumerate(planned) if ni.score(0, 0, n, -0.01) >= bounds[k])
    assert len(looks) == expect + 1 and looks[-1].decision == ni.NON_INFERIOR
    assert all(lk.decision == "continue" for lk in looks[:-1])
    # a 5-point drop (50 lost of 1,000 at each stage's rate): inferior at the first look that crosses -c_k
    bad = [(n // 20, 0, n) for n in planned]
    got = seq.run(bad, planned, 0.01, 0.05)
    assert got[-1].decision == ni.INFERIOR and got[-1].statistic <= -got[-1].boundary
    # an undecided comparison after the last look stays undecided
    tie = [(n // 100, 0, n) for n in planned]  # the drop equals the budget
    assert seq.run(tie, planned, 0.01, 0.05)[-1].decision == ni.UNDECIDED


def test_plan_stays_within_the_cap_and_four_looks():
    # planned before any answer is seen: the first stage, then equal stages to the cap
    assert seq.plan(200, 500) == [200, 300, 400, 500]
    assert seq.plan(200, 260) == [200, 220, 240, 260]
    assert seq.plan(200, 200) == [200] and seq.plan(200, None) == [200] and seq.plan(None, 500) == []
    p = seq.plan(10, 10_000)
    assert len(p) == seq.MAX_LOOKS and p[-1] == 10_000 and p == sorted(p)
