"""Items until decided: a group-sequential rule for one paired non-inferiority comparison on a generated task.

At most `MAX_LOOKS` looks at growing item counts n_1 < ... < n_K (the last is the planned maximum, within
`--max-eval-items`). At look k, Tango's statistic T(-margin) (kvbench.core.noninferiority.score) is compared with a
boundary c_k in both directions: T >= c_k stops "non-inferior", T <= -c_k stops "inferior"; otherwise more items
are generated, and after the last look the comparison stays "undecided". The boundaries spend alpha by the
Lan-DeMets O'Brien-Fleming-type function (Lan & DeMets 1983, Biometrika 70:659-663):

    alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)),   t = n_k / n_K the information fraction,

one-sided in each direction: c_k solves P(Z_1 < c_1, ..., Z_{k-1} < c_{k-1}, Z_k >= c_k) = alpha(t_k) -
alpha(t_{k-1}) for the canonical joint normal of the score statistics (corr(Z_i, Z_j) = sqrt(t_i / t_j)), so
the chance of ever stopping wrongly in one direction is alpha. Early looks need overwhelming evidence; the last
look's boundary is close to the fixed-size z.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.core import noninferiority as ni

MAX_LOOKS = 4
SPENDING = "Lan-DeMets O'Brien-Fleming-type alpha spending, one-sided in each direction"


def spent(t: float, alpha: float) -> float:
    """alpha(t): the one-sided error spent by information fraction t (0 < t <= 1)."""
    from scipy.stats import norm

    if t <= 0:
        return 0.0
    return float(2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(min(t, 1.0))))


def _corr(fractions: list[float]):
    import numpy as np

    t = np.asarray(fractions, dtype=float)
    return np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))


def boundaries(fractions: list[float], alpha: float) -> list[float]:
    """The critical z at each look (information fractions increasing, the last 1.0)."""
    from scipy.optimize import brentq
    from scipy.stats import multivariate_normal, norm

    if len(fractions) > MAX_LOOKS or any(b <= a for a, b in zip(fractions, fractions[1:], strict=False)):
        raise ValueError(f"at most {MAX_LOOKS} looks, at increasing information fractions: {fractions}")
    out: list[float] = []
    for k, t in enumerate(fractions):
        target = 1 - spent(t, alpha)  # P(no crossing by look k)
        if k == 0:
            out.append(float(norm.ppf(target)))
            continue
        cov = _corr(fractions[: k + 1])
        mvn = multivariate_normal(mean=[0.0] * (k + 1), cov=cov, allow_singular=True)

        def gap(c: float, k=k, mvn=mvn, target=target) -> float:
            return float(mvn.cdf([*out[:k], c])) - target

        out.append(float(brentq(gap, 0.0, 10.0, xtol=1e-6)))
    return out


@dataclass(frozen=True)
class Look:
    """One look: the items so far, the paired counts, Tango's statistic and the boundary it met or not."""

    items: int
    losses: int
    gains: int
    statistic: float
    boundary: float
    spent: float  # cumulative one-sided alpha spent by this look
    decision: str  # non-inferior / inferior / continue / undecided (after the last look)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def look(losses: int, gains: int, n: int, margin: float, boundary: float, last: bool) -> str:
    t = ni.score(losses, gains, n, -margin)
    if t >= boundary:
        return ni.NON_INFERIOR
    if t <= -boundary:
        return ni.INFERIOR
    return ni.UNDECIDED if last else "continue"


def run(counts: list[tuple[int, int, int]], planned: list[int], margin: float, alpha: float) -> list[Look]:
    """Apply the rule to the (losses, gains, n) seen at each look so far (n equal to the planned counts);
    returns the looks taken, the last one carrying the decision (stops at the first decision)."""
    fractions = [n / planned[-1] for n in planned]
    bounds = boundaries(fractions, alpha)
    out = []
    for k, (b, c, n) in enumerate(counts):
        decision = look(b, c, n, margin, bounds[k], k == len(planned) - 1)
        out.append(Look(n, b, c, ni.score(b, c, n, -margin), bounds[k], spent(fractions[k], alpha), decision))
        if decision != "continue":
            break
    return out


def plan(first: int | None, cap: int | None) -> list[int]:
    """Items per task at each look, fixed before any answer is seen: [first, ..., cap] in equal stages (at most
    MAX_LOOKS looks); [first] when the cap leaves no room, [] without a first stage."""
    if not first or not cap or cap <= first:
        return [first] if first else []
    step = math.ceil((cap - first) / (MAX_LOOKS - 1))
    looks = [first]
    while looks[-1] < cap:
        looks.append(min(cap, looks[-1] + step))
    return looks
