"""Fidelity per token: the math only (no HTTP; harness/quality/fidelity.py asks the servers).

At every scored position the reference (auto at rest) and a candidate (a dtype, in a condition) each give a
next-token distribution over the same teacher-forced sequence. From the pair:
- KL(auto || dtype) in nats. From full-vocabulary logprobs it is exact; from top-k logprobs the two
  distributions are compared on the tokens both sides listed plus one bucket holding the remaining mass,
  a coarser partition of the vocabulary, so the value is a lower bound on the true KL (data processing
  inequality; llama.cpp and vLLM's top-k scoring do the same).
- whether the top token agrees, and the change in log p of the reference's teacher-forced token.
Per condition: mean KLD over tokens with a 95% CI by bootstrap over items (tokens clustered by item), P99 KLD,
top-token agreement with its CI.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

BOOTSTRAP = 2000  # resamples of the items
SEED = 20261205
TAIL_FLOOR = 1e-6  # a tail below this is float32 logprobs' rounding (summing 512 of them), not probability
KL_SLACK = 1e-6  # a KL this far below 0 is rounding; further below, the inputs were not distributions
METHOD_TOPK = "top-{k} logprobs + one tail bucket (a lower bound on KL)"
METHOD_FULL = "full-vocabulary logprobs ({k} tokens: the exact KL)"


def kl_full(p_logprobs: Sequence[float], q_logprobs: Sequence[float]) -> float:
    """KL(P || Q) in nats from two full-vocabulary log-probability vectors."""
    lp, lq = np.asarray(p_logprobs, dtype=np.float64), np.asarray(q_logprobs, dtype=np.float64)
    p = np.exp(lp)
    keep = p > 0
    return float(max(0.0, np.sum(p[keep] * (lp[keep] - lq[keep]))))


def kl_topk(p: Mapping[int, float], q: Mapping[int, float]) -> float:
    """A lower bound on KL(P || Q) in nats from top-k logprobs ({token id: logprob}, each side's own top k,
    with any extra token it was asked about): the tokens both sides list, plus one bucket for the rest."""
    shared = [t for t in p if t in q]
    lp = np.array([p[t] for t in shared], dtype=np.float64)
    lq = np.array([q[t] for t in shared], dtype=np.float64)
    pp, pq = np.exp(lp), np.exp(lq)
    kl = float(np.sum(pp * (lp - lq)))
    rest_p, rest_q = 1.0 - float(pp.sum()), 1.0 - float(pq.sum())
    if rest_p > TAIL_FLOOR or rest_q > TAIL_FLOOR:  # both below: the lists covered the vocabulary
        kl += max(rest_p, 0.0) * (math.log(max(rest_p, 1e-12)) - math.log(max(rest_q, 1e-12)))
    if not math.isfinite(kl) or kl < -KL_SLACK:  # impossible for two distributions: the input was not one
        return float("nan")
    return max(0.0, kl)  # a rounding-sized negative is zero


def top1(dist: Mapping[int, float]) -> int:
    return max(dist, key=dist.__getitem__)


def compare_position(p: Mapping[int, float], q: Mapping[int, float], token: int) -> tuple[float, bool, float]:
    """(KL(P || Q) lower bound, top tokens agree, log q(token) - log p(token)) at one scored position."""
    dlogp = q[token] - p[token] if token in p and token in q else float("nan")
    return kl_topk(p, q), top1(p) == top1(q), dlogp


def compare_item(ref: Sequence[Mapping[int, float]], cand: Sequence[Mapping[int, float]], tokens: Sequence[int]):
    """Per-token KL, agreement and Δ log p over one item's scored positions (ref, cand: one dict each)."""
    rows = [compare_position(p, q, t) for p, q, t in zip(ref, cand, tokens, strict=True)]
    return {
        "kld": [r[0] for r in rows],
        "agree": [bool(r[1]) for r in rows],
        "dlogp": [r[2] for r in rows],
    }


def _ratio_ci(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> list[float]:
    """95% percentile CI of sum(num)/sum(den) with items resampled (each item's tokens stay together)."""
    n = len(num)
    if n < 2:
        return [float("nan"), float("nan")]
    idx = rng.integers(0, n, size=(BOOTSTRAP, n))
    stats = num[idx].sum(1) / np.maximum(den[idx].sum(1), 1)
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return [float(lo), float(hi)]


def _finite_positions(it: Mapping) -> dict:
    """An item's positions whose KL is a number (kl_topk gives NaN for inputs that are not distributions)."""
    keep = [i for i, k in enumerate(it["kld"]) if math.isfinite(k)]
    return {**it, **{key: [it[key][i] for i in keep] for key in ("kld", "agree", "dlogp")}}


def summarize(items: Sequence[Mapping], method: str, seed: int = SEED) -> dict:
    """One condition's summary from compare_item's outputs (+ optional "gold_dlogp" per item). Positions whose
    KL is not a number are left out and counted (`dropped_positions`), never read as zero."""
    before = sum(len(it["kld"]) for it in items)
    items = [f for f in (_finite_positions(it) for it in items) if f["kld"]]
    kld = np.concatenate([np.asarray(it["kld"], dtype=np.float64) for it in items]) if items else np.array([])
    out = {"items": len(items), "tokens": int(kld.size), "method": method}
    if before > kld.size:
        out["dropped_positions"] = before - int(kld.size)
    if not items:
        return {**out, "mean_kld": None, "mean_kld_ci": None, "p99_kld": None, "top1_agreement": None,
                "top1_agreement_ci": None}  # fmt: skip
    rng = np.random.default_rng(seed)
    sums = np.array([float(np.sum(it["kld"])) for it in items])
    agree = np.array([float(np.sum(it["agree"])) for it in items])
    counts = np.array([len(it["kld"]) for it in items], dtype=np.float64)
    dlogp = np.concatenate([np.asarray(it["dlogp"], dtype=np.float64) for it in items])
    gold = [it.get("gold_dlogp") for it in items if it.get("gold_dlogp") is not None]
    out.update(
        mean_kld=float(kld.mean()),
        mean_kld_ci=_ratio_ci(sums, counts, rng),
        p99_kld=float(np.percentile(kld, 99)),
        max_kld=float(kld.max()),
        top1_agreement=float(agree.sum() / counts.sum()),
        top1_agreement_ci=_ratio_ci(agree, counts, rng),
        mean_dlogp=float(np.nanmean(dlogp)) if np.isfinite(dlogp).any() else None,
        rms_dlogp=float(np.sqrt(np.nanmean(dlogp**2))) if np.isfinite(dlogp).any() else None,
        mean_gold_dlogp=float(np.mean(gold)) if gold else None,
    )
    return out


def _overlaps(a: Sequence[float] | None, b: Sequence[float] | None) -> bool:
    if not a or not b or any(x is None or not math.isfinite(x) for x in (*a, *b)):
        return False
    return a[0] <= b[1] and b[0] <= a[1]


def no_measurable_change(candidate: dict, floor: dict) -> bool:
    """True when a dtype's fidelity cannot be told from the floor (auto under load vs auto at rest: batch
    variance alone): its mean-KLD CI reaches down into the floor's and its top-token agreement CI reaches up
    into the floor's. Missing or non-finite intervals never count as "no change"."""
    if not candidate or not floor:
        return False
    return _overlaps(candidate.get("mean_kld_ci"), floor.get("mean_kld_ci")) and _overlaps(
        candidate.get("top1_agreement_ci"), floor.get("top1_agreement_ci")
    )


def versus_floor(candidate: dict, floor: dict) -> str:
    """What a dtype's fidelity says against the floor: "not measured" (no item scored: never "above the floor",
    N-P13), "no measurable change", or "above the floor"."""
    if not candidate or not candidate.get("items") or candidate.get("mean_kld") is None:
        return "not measured (0 items)"
    return "no measurable change" if no_measurable_change(candidate, floor) else "above the floor"
