"""kvbench.core.noninferiority against published values, scipy and exact enumeration."""

from __future__ import annotations

import pytest
from scipy.stats import binom, norm

from kvbench.core import noninferiority as ni

# Fagerland, Lydersen & Laake (2017), Statistical Analysis of Contingency Tables, ch. 8 (as reproduced by the
# R package contingencytables): Cavo et al. (2012), 59 / 6 / 16 / 80 pairs. The first measurement is the
# candidate: 6 items only it got right (gains), 16 only the reference did (losses).
CAVO = {"losses": 16, "gains": 6, "n": 161}


def test_tango_interval_matches_the_published_example():
    # Tango asymptotic score interval: estimate -0.0621, 95% CI -0.1240 to -0.0054 (two one-sided 97.5% bounds)
    lo, hi = ni.bounds(**CAVO, confidence=0.975)
    assert (lo, hi) == pytest.approx((-0.1240, -0.0054), abs=5e-5)


def test_tango_statistic_at_zero_is_mcnemars():
    # the same source: McNemar asymptotic test Z = -2.132, P = 0.033006
    z = ni.score(**CAVO, d0=0.0)
    assert z == pytest.approx(-2.132, abs=5e-4)
    assert 2 * norm.sf(abs(z)) == pytest.approx(0.033006, abs=5e-7)
    assert z == pytest.approx((6 - 16) / 22**0.5)  # (c - b) / sqrt(b + c)


def test_no_discordant_pair_has_a_closed_form():
    # b = c = 0: T(-m) = sqrt(n m / (1 - m)), so the one-sided bound is -z^2 / (n + z^2)
    z = norm.ppf(0.95)
    assert ni.bounds(0, 0, 500, 0.95)[0] == pytest.approx(-(z**2) / (500 + z**2), abs=1e-9)
    assert ni.score(0, 0, 500, -0.01) == pytest.approx((500 * 0.01 / 0.99) ** 0.5)


@pytest.mark.parametrize(("losses", "gains", "n"), [(2, 0, 500), (7, 3, 400), (30, 12, 250)])
def test_bounds_and_p_values_are_the_same_statement(losses, gains, n):
    lo, hi = ni.bounds(losses, gains, n, 0.95)
    p_ni, _ = ni.p_values(losses, gains, n, margin=-lo)  # the budget equal to the bound: p exactly alpha
    assert p_ni == pytest.approx(0.05, abs=1e-7)
    _, p_inf = ni.p_values(losses, gains, n, margin=-hi)
    assert p_inf == pytest.approx(0.05, abs=1e-7)


def test_holm_adjusts_step_down():
    # sorted 0.005, 0.01, 0.03, 0.04 of 4: 4 x 0.005 = 0.02, 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, then max(0.06, 0.04)
    assert ni.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert ni.holm([0.2]) == [0.2] and ni.holm([0.6, 0.7]) == [1.0, 1.0]


def _exact_power(n: int, p_loss: float, p_gain: float, margin: float, alpha: float, towards: str) -> float:
    """P(the test decides `towards` at one-sided level alpha) over n items with these loss / gain rates."""
    z = norm.ppf(1 - alpha)
    disc = p_loss + p_gain
    total = 0.0
    for d in range(n + 1):
        w = binom.pmf(d, n, disc)
        if w < 1e-12:
            continue
        for b in range(d + 1):
            wb = binom.pmf(b, d, p_loss / disc)
            t = ni.score(b, d - b, n, -margin)
            if (t >= z) if towards == ni.NON_INFERIOR else (t <= -z):
                total += w * wb
    return total


@pytest.mark.parametrize(
    ("losses", "gains", "n", "towards"),
    [(2, 0, 500, ni.NON_INFERIOR), (10, 10, 400, ni.NON_INFERIOR), (10, 1, 250, ni.INFERIOR)],
)
def test_items_needed_give_eighty_percent_power(losses, gains, n, towards):
    need = ni.items_needed(losses, gains, n, margin=0.01, alpha=0.05)
    power = _exact_power(need, losses / n, gains / n, 0.01, 0.05, towards)
    assert 0.75 <= power <= 0.88, (need, power)  # a normal-approximation sample size, checked exactly


def test_items_needed_edges():
    assert ni.items_needed(0, 0, 60, margin=0.01, alpha=0.05) == 268  # z^2 (1 - m) / m: 2.706 x 99 = 267.9
    assert ni.items_needed(5, 0, 500, margin=0.01, alpha=0.05) is None  # a drop exactly at the budget


def test_decide_reads_each_verdict():
    budget = 0.01
    got = ni.decide([(2, 0, 500, budget), (0, 0, 500, budget), (30, 0, 500, budget)], 0.95)
    assert [r.verdict for r in got] == [ni.UNDECIDED, ni.NON_INFERIOR, ni.INFERIOR]
    assert got[0].items_needed and got[1].items_needed is None
    # Holm: the strictest level is alpha / 3 for the smallest p of each direction
    assert min(r.alpha_used for r in got) == pytest.approx(0.05 / 3)


def test_identical_answers_are_non_inferior_at_the_full_level_and_inferior_stays_holm_adjusted():
    """Intersection-union (Berger 1982): 400 identical items on each of 6 tests, each at the full 95% (bound
    0.67 points < 1); Holm on that side would need each at 99.17% (bound 1.4 points: undecided)."""
    got = ni.decide([(0, 0, 400, 0.01)] * 6, 0.95)
    assert all(r.verdict == ni.NON_INFERIOR and r.alpha_used == pytest.approx(0.05) for r in got)
    assert all(-r.lower < 0.01 for r in got)
    # a 3-point drop on 1,000 items (40 lost, 10 gained) on each of 6 tests: inferior, at Holm's levels
    bad = ni.decide([(40, 10, 1000, 0.01)] * 6, 0.95)
    assert all(r.verdict == ni.INFERIOR for r in bad)
    assert sorted(r.alpha_used for r in bad)[0] == pytest.approx(0.05 / 6)
