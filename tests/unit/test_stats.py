"""kvbench.core.stats against published values and exact arithmetic."""

from __future__ import annotations

import math

import pytest

from kvbench.core import stats


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Stat Med 17:857-872: its worked
        # examples, method 3 (the Wilson score interval without continuity correction).
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombe_table(k, n, lo, hi):
    got = stats.wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=5e-5)


def test_wilson_edges():
    assert stats.wilson(0, 0) == (0.0, 1.0)
    assert stats.wilson(10, 10)[1] == 1.0 and stats.wilson(0, 10)[0] == 0.0
    with pytest.raises(ValueError):
        stats.wilson(11, 10)


def test_mcnemar_exact_is_the_binomial_tail():
    # b=1, c=7 (8 discordant pairs): p = 2 * P(X <= 1 | 8, 1/2) = 2 * 9/256
    assert stats.mcnemar_exact(1, 7) == pytest.approx(18 / 256)
    assert stats.mcnemar_exact(7, 1) == stats.mcnemar_exact(1, 7)
    assert stats.mcnemar_exact(10, 0) == pytest.approx(2 / 1024)
    assert stats.mcnemar_exact(5, 5) == 1.0
    assert stats.mcnemar_exact(0, 0) == 1.0


def test_paired_table_from_scores():
    t = stats.PairedTable.from_scores([1, 1, 0, 0, 1], [1, 0, 1, 0, 0])
    assert (t.both, t.ref_only, t.cand_only, t.neither) == (1, 2, 1, 1)
    with pytest.raises(ValueError):
        stats.PairedTable.from_scores([1], [1, 0])


def test_newcombe_interval_is_sane_and_matches_wald_for_large_n():
    small = stats.PairedTable(both=1, ref_only=7, cand_only=1, neither=12)
    diff, lo, hi = stats.paired_difference_ci(small)
    assert diff == pytest.approx(-6 / 21) and -1 <= lo < diff < hi <= 1
    # swapping reference and candidate mirrors the interval
    d2, lo2, hi2 = stats.paired_difference_ci(stats.PairedTable(both=1, ref_only=1, cand_only=7, neither=12))
    assert (d2, lo2, hi2) == pytest.approx((-diff, -hi, -lo))
    # no discordant pairs: the interval still has width (not the degenerate Wald 0..0) and holds 0
    d0, lo0, hi0 = stats.paired_difference_ci(stats.PairedTable(both=450, ref_only=0, cand_only=0, neither=50))
    assert d0 == 0 and lo0 < 0 < hi0
    # large n, moderate proportions: close to the Wald interval for paired data
    t = stats.PairedTable(both=6000, ref_only=900, cand_only=600, neither=2500)
    n, b, c = t.n, t.ref_only, t.cand_only
    d = (c - b) / n
    se = math.sqrt((b + c) / n - d * d) / math.sqrt(n)
    _, lo, hi = stats.paired_difference_ci(t)
    assert lo == pytest.approx(d - stats.Z95 * se, abs=1e-3) and hi == pytest.approx(d + stats.Z95 * se, abs=1e-3)


@pytest.mark.parametrize("alpha", [0.05, 0.05 / 6, 0.001])
def test_critical_losses_are_where_the_exact_test_first_rejects(alpha):
    """The cdf shortcut gives what searching k with the test itself gives, for every d it is asked about."""

    def search(d):
        return next((k for k in range((d + 1) // 2, d + 1) if stats.mcnemar_exact(k, d - k) < alpha), None)

    for d in [*range(1, 90), 299, 500]:
        assert stats._critical_losses(d, alpha) == search(d), d


def test_detectable_drop():
    # Only losses: the exact test needs >= 6 of 6 discordant pairs one way (2 * 2^-6 < 0.05 <= 2 * 2^-5), so
    # for n items the drop d must give P(Binomial(n, d) >= 6) >= 0.8.
    from scipy.stats import binom

    d = stats.detectable_drop(500)
    assert binom.sf(5, 500, d) == pytest.approx(0.8, abs=1e-6)
    assert 0.01 < d < 0.02  # 500 items can see a 2-point drop
    assert stats.detectable_drop(500, gain_rate=0.02) > d  # background flips make a drop harder to see
    assert stats.detectable_drop(3) is None  # 3 items cannot reach p < 0.05 at all


def test_verdicts():
    same = stats.compare([1] * 50 + [0] * 50, [1] * 50 + [0] * 50)
    assert same.verdict.startswith("no significant change") and not same.significant
    drop = stats.compare([1] * 100, [1] * 90 + [0] * 10)
    assert drop.significant and drop.verdict.startswith("drop of 10.0 points (95% CI -") and "p = 0.002" in drop.verdict
    gain = stats.compare([1] * 90 + [0] * 10, [1] * 100)
    assert gain.verdict.startswith("gain of 10.0 points")


def test_newcombe_interval_matches_the_published_paired_example():
    # Fagerland, Lydersen & Laake (2017), Statistical Analysis of Contingency Tables, ch. 8: complete response
    # before and after consolidation therapy (Cavo et al. 2012), 59 / 6 / 16 / 80 pairs; the Newcombe
    # square-and-add interval for p1+ - p+1 is -0.0621 (95% CI -0.1186 to -0.0046). Here the candidate is the
    # first measurement: 6 gains, 16 losses.
    diff, lo, hi = stats.paired_difference_ci(stats.PairedTable(both=59, ref_only=16, cand_only=6, neither=80))
    assert (diff, lo, hi) == pytest.approx((-0.0621, -0.1186, -0.0046), abs=5e-5)


def test_the_detectable_drop_of_a_comparison_counts_the_items_the_dtype_gains():
    """A dtype that gains 1% of the items (auto wrong, it right) hides part of a drop: at 500 items the exact
    McNemar test at 80% power sees 2.8 points, not the 1.6 that assumes it never gains."""
    from kvbench.harness.quality.evalrecord import _paired

    ref = {i: 1.0 for i in range(500)}
    cand = dict(ref)
    for i in range(5):
        ref[i] = 0.0
    got = _paired(ref, cand)["detectable_drop"]
    assert got == pytest.approx(stats.detectable_drop(500, gain_rate=0.01)) and 0.027 < got < 0.029
    assert stats.detectable_drop(500) == pytest.approx(0.0158, abs=1e-4)
