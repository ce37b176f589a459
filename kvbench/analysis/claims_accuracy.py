"""Accuracy claims ("<1% accuracy loss") judged by the run's verdict, not by a point estimate.

A measured accuracy claim is held to kvbench.analysis.verdict's statement for the claim's dtype against auto:
non-inferior within the budget -> holds, inferior -> fails, undecided -> "not decided" (with the items that would decide
it). Only runs of a model the claim speaks of count: its own model, or (measured_on = "any-model", a claim "across
benchmarks") any real model, but never kvbench's tiny model unless the claim names it. A claim measured on the
tiny model only reads "not checkable here", with the tiny model's figure beside it as context, labelled.
"""

from __future__ import annotations

from kvbench.core.errors import UsageError

TINY_PREFIX = "kvbench-tiny"  # kvbench.tinymodel's models: kvbench-tiny-llama, kvbench-tiny-qwen3-gqa
NOT_DECIDED, NOT_HERE = "not decided", "not checkable here"


def judge(runs, claim: dict, models: dict) -> dict | None:
    """The newest run (of a model the claim speaks of) that evaluated the claim's dtype and auto, as
    {state, drop, items_needed, budget, where, context_only}; else the tiny model's, marked context_only."""
    if "task_accuracy_rest" not in runs:
        return None
    match = runs[runs["task_accuracy_rest"].notna()]
    names = {claim.get("model"), (models.get(claim.get("model")) or {}).get("hf_id")} - {None}
    tiny = match["model"].astype(str).str.startswith(TINY_PREFIX).astype(bool)
    named = match["model"].isin(names).astype(bool)
    speaks = named if claim.get("measured_on") != "any-model" else (~tiny) | named
    found = _newest(match[speaks], claim)
    if found is not None:
        return found
    context = _newest(match[tiny], claim)
    return {**context, "context_only": True} if context is not None else None


def _newest(match, claim: dict) -> dict | None:
    for run in newest_first(match):
        by = run["task_accuracy_rest"]
        if not {claim.get("dtype"), "auto"} <= set(by.index):
            continue
        out = {"where": measured_where(run, claim), "context_only": False, "state": None, "items_needed": None}
        out["drop"] = float((by["auto"] - by[claim["dtype"]]) * 100)
        path = run["path"].iloc[0] if "path" in run else None
        out.update(_verdict(path, claim["dtype"]))
        return out
    return None


def _verdict(path, dtype: str) -> dict:
    """What kvbench.analysis.verdict says of `dtype`'s accuracy in the record at `path` (nothing if unreadable)."""
    from kvbench.analysis.verdict import decide
    from kvbench.records import read_record

    if not isinstance(path, str):  # a frame built without paths (or a NaN)
        return {}
    try:
        d = decide(read_record(path))
    except UsageError:
        return {}
    if dtype not in d.dtypes:
        return {}
    a = d.dtypes[dtype].accuracy
    lead = a.primary or (max(a.tests, key=lambda t: t.drop) if a.tests else None)
    bound = None
    if lead is not None:  # inferior: the smallest drop the data allow; otherwise the largest
        r = lead.result
        side = f"at least {-r.upper * 100:.2f}" if r.verdict == "inferior" else f"at most {-r.lower * 100:.2f}"
        bound = f"{side} at one-sided {100 * (1 - r.alpha_used):.4g}%"
    needs = [t.result.items_needed for t in (a.primary, *a.tests) if t is not None and t.result.items_needed]
    return {
        "state": a.state,
        "drop": lead.drop if lead is not None else None,
        "bound": bound,
        "endpoint": lead.task if lead is not None else None,
        "items_needed": (a.primary.result.items_needed if a.primary else max(needs, default=None)),
        "budget": d.policy.budget,
    }


def verdict(judged: dict, claimed: float) -> tuple[str, str, str, float | None]:
    """(verdict, its label, what the derivation adds, the measured value) for a judged accuracy claim."""
    from kvbench.core.noninferiority import INFERIOR, NON_INFERIOR, UNDECIDED

    drop = judged.get("drop")
    state = judged.get("state")
    figure = f"{drop:.2f} points lost vs auto" if drop is not None else "no drop measured"
    if judged.get("endpoint"):
        figure += f" ({judged['endpoint']}; drop {judged['bound']})"
    where = judged.get("where", "")
    if judged.get("context_only"):
        text = (
            f"context only, not a judgement: kvbench's tiny model, which the claim does not speak of, {figure}, "
            f"verdict {state or 'unknown'} ({where})"
        )
        return "not checkable", NOT_HERE, text, None
    budget = judged.get("budget")
    at = f"verdict at the run's budget of {budget:g} points" if budget is not None else "verdict"
    if budget is not None and abs(budget - claimed) > 1e-9:
        at += f" (the claim says < {claimed:g})"
    text = f"{at}: {state or 'none'}; measured {figure}; {where}"
    if state == NON_INFERIOR:
        return "holds", "holds", text, drop
    if state == INFERIOR:
        return "fails", "fails", text, drop
    need = judged.get("items_needed")
    label = f"{NOT_DECIDED} (about {need:,} items would decide it)" if need else NOT_DECIDED
    if state is None:
        text += "; the run record is not at hand to judge it by its verdict"
    elif state != UNDECIDED:
        label = f"{NOT_DECIDED} ({state})"
    return NOT_DECIDED, label, text, drop


def newest_first(match):
    """Each run's rows in `match` indexed by KV dtype, the newest run first."""
    for run_id in reversed(list(dict.fromkeys(match.sort_values("created_at")["run_id"]))):
        yield match[match["run_id"] == run_id].set_index("kv_cache_dtype")


def measured_where(run, claim: dict) -> str:
    """Which run a format-level claim's measured value came from (and that it was emulated, where it was)."""
    row = run.loc[claim.get("dtype")]
    emulated = " (emulated on CPU: capacity and accuracy are what the format stores)" if row.get("emulated") else ""
    where = " ".join(str(x) for x in (row.get("machine"), "run", row.get("run_id")) if x is not None)
    return f"measured on {row.get('model')}, {where}{emulated}"
