"""Statistics for task accuracy: per-dtype intervals and the paired comparison of a dtype against `auto`.

- `wilson`: the Wilson score interval for one proportion (Wilson 1927; Newcombe 1998a, Stat Med 17:857-872,
  whose worked examples the tests reproduce).
- `mcnemar_exact`: McNemar's exact test on the discordant pairs of two paired 0/1 score vectors: under "no
  difference" the items one side got right and the other wrong split Binomial(b + c, 1/2); two-sided p =
  min(1, 2 * P(X <= min(b, c))) (scipy.stats.binomtest, which gives exactly that for p = 1/2).
- `paired_difference_ci`: Newcombe's method 10 for the difference of paired proportions (Newcombe 1998b,
  "Improved confidence intervals for the difference between binomial proportions based on paired data",
  Stat Med 17:2635-2650): the Wilson intervals of both proportions combined with the phi correlation of
  the pairs (with Newcombe's n/2 correction of a positive ad - bc). It stays inside [-1, 1] and is not
  degenerate at 0 discordant pairs, unlike the Wald interval. The accuracy *verdict* uses Tango's score
  test instead (kvbench.core.noninferiority): it has a p-value, which Holm's correction needs.
- `detectable_drop`: the smallest true drop that the exact McNemar test at `alpha` finds with probability
  `power` over n paired items, computed exactly (no normal approximation) under the stated model of
  discordance: a dtype loses items at rate `drop + gain_rate` and gains items at `gain_rate`.

All proportions are fractions in [0, 1]; "points" in verdicts are percentage points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

Z95 = 1.959963984540054  # scipy.stats.norm.ppf(0.975)


def _z(confidence: float) -> float:
    if confidence == 0.95:
        return Z95
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for successes/n; (0, 1) when n == 0 (nothing is known)."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return 0.0, 1.0
    z = _z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Exact at the boundaries (floating point would give 1e-17 instead of 0).
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


@dataclass(frozen=True)
class PairedTable:
    """Paired 0/1 outcomes of a reference (`auto`) and a candidate on the same items."""

    both: int  # both right
    ref_only: int  # the reference right, the candidate wrong: the candidate's losses (b)
    cand_only: int  # the candidate right, the reference wrong: its gains (c)
    neither: int

    @property
    def n(self) -> int:
        return self.both + self.ref_only + self.cand_only + self.neither

    @classmethod
    def from_scores(cls, reference: Sequence[int], candidate: Sequence[int]) -> PairedTable:
        if len(reference) != len(candidate):
            raise ValueError(f"paired scores differ in length: {len(reference)} vs {len(candidate)}")
        counts = [0, 0, 0, 0]
        for r, c in zip(reference, candidate, strict=True):
            if r not in (0, 1) or c not in (0, 1):
                raise ValueError("scores must be 0 or 1")
            counts[(1 - r) * 2 + (1 - c)] += 1
        # index: r=1,c=1 -> 0; r=1,c=0 -> 1; r=0,c=1 -> 2; r=0,c=0 -> 3
        return cls(*counts)


def mcnemar_exact(losses: int, gains: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (1.0 when there are none)."""
    d = losses + gains
    if d == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(min(losses, gains), d, 0.5).pvalue)


def paired_difference_ci(table: PairedTable, confidence: float = 0.95) -> tuple[float, float, float]:
    """(candidate - reference, lower, upper): Newcombe's method 10 (see the module doc)."""
    a, b, c, d, n = table.both, table.ref_only, table.cand_only, table.neither, table.n
    if n == 0:
        return 0.0, -1.0, 1.0
    p_ref, p_cand = (a + b) / n, (a + c) / n
    l_ref, u_ref = wilson(a + b, n, confidence)
    l_cand, u_cand = wilson(a + c, n, confidence)
    denom = (a + b) * (c + d) * (a + c) * (b + d)
    # Newcombe's phi: a positive ad - bc is reduced by n/2 (not below 0), a negative one kept as is
    cross = a * d - b * c
    cross = max(0.0, cross - n / 2) if cross > 0 else cross
    phi = cross / math.sqrt(denom) if denom > 0 else 0.0
    diff = p_cand - p_ref
    # Newcombe's formula for theta = p1 - p2 with p1 = candidate, p2 = reference.
    below_c, above_r = p_cand - l_cand, u_ref - p_ref
    above_c, below_r = u_cand - p_cand, p_ref - l_ref
    dl = math.sqrt(max(0.0, below_c**2 - 2 * phi * below_c * above_r + above_r**2))
    du = math.sqrt(max(0.0, above_c**2 - 2 * phi * above_c * below_r + below_r**2))
    return diff, max(-1.0, diff - dl), min(1.0, diff + du)


@cache
def _critical_losses(d: int, alpha: float) -> int | None:
    """The smallest loss count k (of d discordant pairs) with an exact two-sided p below alpha; None if none.
    Found from the binomial cdf at once (p = 2 P(X <= d - k) for k >= d/2), then confirmed by the test itself
    at k and k - 1; where float rounding would make those disagree, the plain search over k decides."""
    import numpy as np
    from scipy.stats import binom

    first = (d + 1) // 2
    ks = np.arange(first, d + 1)
    below = np.flatnonzero(2 * binom.cdf(d - ks, d, 0.5) < alpha)
    if not len(below):
        if mcnemar_exact(d, 0) >= alpha:
            return None
    else:
        k = int(ks[below[0]])
        if mcnemar_exact(k, d - k) < alpha and (k == first or mcnemar_exact(k - 1, d - k + 1) >= alpha):
            return k
    for k in range(first, d + 1):
        if mcnemar_exact(k, d - k) < alpha:
            return k
    return None


@cache
def _critical_table(n: int, alpha: float):
    """For every discordant count d in 1..n that can reject at all: (d, its critical loss count) as arrays."""
    import numpy as np

    pairs = [(d, k) for d in range(1, n + 1) if (k := _critical_losses(d, alpha)) is not None]
    return np.array([d for d, _ in pairs], dtype=int), np.array([k for _, k in pairs], dtype=int)


def mcnemar_power(n: int, drop: float, gain_rate: float = 0.0, alpha: float = 0.05) -> float:
    """Probability that the exact McNemar test rejects (in the direction of a drop) over n paired items when
    the candidate loses items at rate drop + gain_rate and gains at gain_rate: the sum over discordant counts d
    of P(d discordant) * P(at least d's critical losses among them), one vectorised scipy call per factor."""
    import numpy as np
    from scipy.stats import binom

    p_loss, p_gain = drop + gain_rate, gain_rate
    p_disc = p_loss + p_gain
    if p_disc <= 0 or n <= 0:
        return 0.0
    if p_disc > 1:
        raise ValueError("drop + 2 * gain_rate exceeds 1")
    ds, ks = _critical_table(n, alpha)
    if not len(ds):
        return 0.0
    pd = binom.pmf(ds, n, p_disc)
    keep = pd >= 1e-15  # terms too small to move the sum
    return float(np.sum(pd[keep] * binom.sf(ks[keep] - 1, ds[keep], p_loss / p_disc)))


@cache  # a report asks for the same n once per dtype and concurrency
def detectable_drop(n: int, gain_rate: float = 0.0, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest drop (fraction) that n paired items detect with `power` (see the module doc); None when
    even losing every item would not be detected (n too small)."""
    if n <= 0 or mcnemar_power(n, 1.0 - 2 * gain_rate, gain_rate, alpha) < power:
        return None
    lo, hi = 0.0, 1.0 - 2 * gain_rate
    for _ in range(40):  # bisection to ~1e-12; power rises with the drop
        mid = (lo + hi) / 2
        if mcnemar_power(n, mid, gain_rate, alpha) >= power:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class Comparison:
    """A candidate dtype against the reference on the same items."""

    n: int
    reference: float  # accuracy, fraction
    candidate: float
    difference: float  # candidate - reference, fraction
    ci_low: float
    ci_high: float
    p_value: float
    losses: int
    gains: int
    significant: bool
    verdict: str


def compare(reference: Sequence[int], candidate: Sequence[int], alpha: float = 0.05) -> Comparison:
    """Paired comparison: McNemar's exact p, Newcombe's interval, and the verdict line."""
    table = PairedTable.from_scores(reference, candidate)
    diff, lo, hi = paired_difference_ci(table)
    p = mcnemar_exact(table.ref_only, table.cand_only)
    n = table.n
    return Comparison(
        n=n,
        reference=(table.both + table.ref_only) / n if n else math.nan,
        candidate=(table.both + table.cand_only) / n if n else math.nan,
        difference=diff,
        ci_low=lo,
        ci_high=hi,
        p_value=p,
        losses=table.ref_only,
        gains=table.cand_only,
        significant=p < alpha,
        verdict=verdict(diff, lo, hi, p, alpha),
    )


def fmt_p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def verdict(diff: float, lo: float, hi: float, p: float, alpha: float = 0.05) -> str:
    """'no significant change (...)', 'drop of X points (95% CI a..b, p = ...)' or 'gain of ...'."""
    ci = f"95% CI {lo * 100:+.1f}..{hi * 100:+.1f} points, {fmt_p(p)}"
    if p >= alpha:
        return f"no significant change ({diff * 100:+.1f} points, {ci})"
    word = "drop" if diff < 0 else "gain"
    return f"{word} of {abs(diff) * 100:.1f} points ({ci})"
