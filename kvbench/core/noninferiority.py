"""Non-inferiority of a candidate's task accuracy against a reference on the same items (paired 0/1 scores).

The question a budget asks is one-sided: "does the candidate lose at most `margin` (a fraction) against the
reference?" With b items the reference got right and the candidate wrong (losses), c the other way (gains)
and n items in all, the difference delta = (c - b) / n is tested against -margin with:

- Tango's asymptotic score test for paired proportions (Tango 1998, "Equivalence test and confidence
  interval for the difference in proportions for the paired-sample design", Stat Med 17:891-908):
      T(d0) = (c - b - n d0) / sqrt(n (2 q + d0 (1 - d0)))
  q being the maximum-likelihood estimate of P(reference only) under delta = d0 (a closed-form root).
  At d0 = 0 it is McNemar's z. Non-inferior at level alpha when T(-margin) >= z(1 - alpha); inferior
  (worse than the margin) when T(-margin) <= -z(1 - alpha). Its one-sided bounds are the d0 where T
  crosses +-z, so "bound inside the budget" and "the test rejects" are the same statement.
- Two claims, two rules. "Non-inferior on every test" is an intersection-union claim: it holds only when every
  test rejects its own null, so each test runs at the full level alpha with no multiplicity correction (Berger
  1982, "Multiparameter hypothesis testing and acceptance sampling", Technometrics 24:295-300). "Inferior
  somewhere" is a union claim: one of k tests rejecting suffices, so it is Holm-adjusted (Holm 1979).
- The items a test needs for 80% power, from the observed loss and gain rates: the score-test sample size
  of Nam (1997, Biometrics 53:1422-1430), n = (z_a s0 + z_b s1)^2 / (delta - d0)^2, s0 under d0 (Tango's
  constrained estimate at the observed rates), s1 = sqrt(p_loss + p_gain - delta^2).

All proportions are fractions; callers print points (x 100).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

METHOD = (
    "Tango score test for paired proportions (one-sided); non-inferior: intersection-union, each test at the "
    "full level (Berger 1982); inferior: Holm-adjusted"
)
POWER = 0.8


def _z(p: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(p))


def _restricted_q(losses: float, gains: float, n: float, d0: float) -> float:
    """Tango's constrained ML estimate of P(reference right, candidate wrong) under delta = d0 (counts or rates)."""
    a = 2 * n
    b = -gains - losses + (2 * n - gains + losses) * d0
    c = -losses * d0 * (1 - d0)
    return (math.sqrt(max(0.0, b * b - 4 * a * c)) - b) / (2 * a)


def score(losses: int, gains: int, n: int, d0: float) -> float:
    """Tango's T(d0); large and positive when the data say delta > d0."""
    num = gains - losses - n * d0
    var = n * (2 * _restricted_q(losses, gains, n, d0) + d0 * (1 - d0))
    if var <= 1e-300:
        return 0.0 if abs(num) < 1e-12 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


def bounds(losses: int, gains: int, n: int, confidence: float) -> tuple[float, float]:
    """One-sided `confidence` lower and upper bounds for delta (each on its own; together a two-sided
    interval at 2 * confidence - 1)."""
    from scipy.optimize import brentq

    z = _z(confidence)
    est = (gains - losses) / n
    eps = 1e-12
    lo = (
        -1.0
        if score(losses, gains, n, -1 + eps) < z
        else brentq(lambda d: score(losses, gains, n, d) - z, -1 + eps, est)
    )
    hi = (
        1.0 if score(losses, gains, n, 1 - eps) > -z else brentq(lambda d: score(losses, gains, n, d) + z, est, 1 - eps)
    )
    return lo, hi


def p_values(losses: int, gains: int, n: int, margin: float) -> tuple[float, float]:
    """(p of "non-inferior": H0 delta <= -margin, p of "inferior": H0 delta >= -margin), one-sided."""
    from scipy.stats import norm

    t = score(losses, gains, n, -margin)
    return float(norm.sf(t)), float(norm.cdf(t))


def _ranks(p: list[float]) -> list[int]:
    order = sorted(range(len(p)), key=lambda i: p[i])
    ranks = [0] * len(p)
    for rank, i in enumerate(order):
        ranks[i] = rank
    return ranks


def holm(p: list[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order: reject test i at level alpha when adjusted[i] <= alpha."""
    out = [1.0] * len(p)
    running = 0.0
    for rank, i in enumerate(sorted(range(len(p)), key=lambda i: p[i])):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


def items_needed(losses: int, gains: int, n: int, margin: float, alpha: float, power: float = POWER) -> int | None:
    """Items that decide this comparison with `power` at one-sided level `alpha` if the observed loss and gain
    rates are the truth: towards non-inferior when the observed drop is inside the margin, towards inferior
    when beyond it; None when the observed drop equals the margin (no number of items decides it)."""
    p_loss, p_gain = losses / n, gains / n
    delta, d0 = p_gain - p_loss, -margin
    if abs(delta - d0) < 1e-12:
        return None
    q = _restricted_q(p_loss, p_gain, 1.0, d0)
    s0 = math.sqrt(max(0.0, 2 * q + d0 * (1 - d0)))
    s1 = math.sqrt(max(0.0, p_loss + p_gain - delta * delta))
    need = (_z(1 - alpha) * s0 + _z(power) * s1) ** 2 / (delta - d0) ** 2
    return max(1, math.ceil(need))


@dataclass(frozen=True)
class Result:
    """One paired comparison against the margin, at the level its direction's rule gives it (`alpha_used`)."""

    n: int
    losses: int
    gains: int
    difference: float  # candidate - reference
    lower: float  # one-sided (1 - alpha_used) lower bound of the difference
    upper: float  # one-sided (1 - alpha_used) upper bound
    p_noninferior: float  # raw: the intersection-union rule uses each test at the full level
    p_inferior: float  # Holm-adjusted
    alpha_used: float  # alpha for non-inferior / undecided, Holm's level for inferior
    verdict: str  # "non-inferior", "inferior", "undecided"
    items_needed: int | None  # at 80% power, at the level of the direction the data point to


NON_INFERIOR, INFERIOR, UNDECIDED = "non-inferior", "inferior", "undecided"


def decide(tables: list[tuple[int, int, int, float]], confidence: float) -> list[Result]:
    """One verdict per (losses, gains, n, margin) table. Non-inferior: each test at the full level alpha
    (intersection-union, Berger 1982: all must hold, so no correction). Inferior: Holm-adjusted over all
    tables. Bounds are given at the level used, so "bound inside the budget" and "non-inferior" say the same
    thing (up to Holm stopping early, which only ever makes "inferior" more cautious)."""
    alpha = 1 - confidence
    k = len(tables)
    raw = [p_values(b, c, n, m) for b, c, n, m in tables]
    adj_inf = holm([p for _, p in raw])
    rank_inf = _ranks([p for _, p in raw])
    out = []
    for i, (b, c, n, margin) in enumerate(tables):
        p_ni = raw[i][0]
        verdict = INFERIOR if adj_inf[i] <= alpha else NON_INFERIOR if p_ni <= alpha else UNDECIDED
        used = alpha / (k - rank_inf[i]) if verdict == INFERIOR else alpha
        lo, hi = bounds(b, c, n, 1 - used)
        need = None
        if verdict == UNDECIDED:  # towards inferior (drop beyond the margin) Holm's strictest level applies
            beyond = (c - b) / n < -margin
            need = items_needed(b, c, n, margin, alpha / k if beyond else alpha)
        out.append(Result(n, b, c, (c - b) / n, lo, hi, p_ni, adj_inf[i], used, verdict, need))
    return out
