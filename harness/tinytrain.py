"""Training the CPU default's tiny Llama to retrieve pass keys, so that its accuracy means something: at `auto`
it answers kvbench's retrieval tasks, and a KV cache that loses fidelity can make it fail.

It learns on the task distribution itself (kvbench.evaltasks with training seeds, never the evaluation
items): pseudo-English haystacks with one or several "pass key" needles at random depths and a question at
the end. Loss is on every token, weighted up on the answer digits; the key written twice in each needle
teaches copying (induction) inside the text too. Sequence lengths grow over training (short first: the
copy circuit forms faster there) up to the CPU default's context, with some longer ones so RoPE sees the
distances of the longer variants.

Deterministic: seeded data and init, a fixed thread count (CPU reductions depend on it), fp32. The report
(`training_report.json`) holds the recipe, the loss curve, wall time, versions, and exact-match accuracy
at fp32 in torch on held-out items per context length.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import random
import time
from pathlib import Path

from kvbench import evaltasks
from kvbench.harness import tinymodel

# Everything that shapes the trained weights; part of the fingerprint, so a change rebuilds the model.
RECIPE = {
    "version": 1,
    "steps": 700,
    "batch": 16,
    "lr": 2e-3,
    "warmup": 40,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.01,
    "betas": [0.9, 0.98],
    "grad_clip": 1.0,
    "answer_weight": 1.0,  # loss weight of answer tokens (and of copied spans in copy examples)
    "text_weight": 0.1,  # loss weight of the rest: the haystack is random words, mostly unpredictable
    "multikey_fraction": 0.25,
    "copy_fraction": 0.3,  # examples that teach copying (induction): spans of earlier text repeated
    # (fraction of training done, largest prompt budget in tokens) : budgets grow along this schedule
    "curriculum": [[0.0, 128], [0.3, 224], [0.55, 448], [1.0, 448]],
    "long_fraction": 0.0,  # share of steps at a longer budget (up to long_budget)
    "long_budget": 960,
    "threads": 2,
    "seed": 7,
}
# Held-out items per context length for the report (fp32, torch, greedy).
REPORT_ITEMS = {512: 200, 1024: 50, 2048: 20}
MULTIKEY_MIN_BUDGET = 160
TRAIN_SEED_BASE = 10_000  # evaluation items use evaltasks.SEED; training never draws from it


def fingerprint() -> str:
    blob = json.dumps({"model": tinymodel.fingerprint(), "train": RECIPE, "tasks": _task_text()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _task_text() -> list[str]:
    # The task wording is what the model learns: changing it must retrain.
    return [evaltasks.PASSKEY_INTRO, evaltasks.PASSKEY_NEEDLE, evaltasks.PASSKEY_QUESTION, evaltasks.MULTIKEY_INTRO,
            evaltasks.MULTIKEY_NEEDLE, evaltasks.MULTIKEY_QUESTION, str(evaltasks.KEY_DIGITS), str(evaltasks.MULTIKEY_KEYS)]


def _budget(step: int, steps: int, rng: random.Random, recipe: dict) -> int:
    frac = step / max(1, steps)
    top = recipe["curriculum"][0][1]
    for at, budget in recipe["curriculum"]:
        if frac >= at:
            top = budget
    if recipe["long_fraction"] and frac >= 0.55 and rng.random() < recipe["long_fraction"]:
        return rng.randint(top, recipe["long_budget"])
    return rng.randint(min(top, 96), top)


def _example(tok, kind: str, budget: int, rng: random.Random) -> tuple[list[int], int]:
    """(token ids with BOS and the answer " 12345." + EOS, index of the first answer token)."""
    if kind == "multikey":
        budget = max(budget, MULTIKEY_MIN_BUDGET)  # four needles and the question alone take ~100 tokens
    item = evaltasks.make_item(kind, budget, rng.random(), rng, tok)
    prompt = tok.encode(item.prompt)  # with BOS, as the server tokenizes it
    full = tok.encode(item.prompt + " " + item.answer + ".") + [tok.eos_token_id]
    assert full[: len(prompt)] == prompt  # the answer starts on a token boundary (digits are split apart)
    return full, len(prompt)


def _copy_example(tok, budget: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(token ids, 0/1 marks of copied tokens): pseudo-English with numbers, and spans of it repeated later,
    so every copied token after a span's first is predictable only by looking back (an induction target)."""
    ids = [tok.bos_token_id]
    marks = [0]
    while len(ids) < budget:
        if len(ids) > 24 and rng.random() < 0.4:
            m = rng.randint(6, min(24, len(ids) - 2))
            start = rng.randrange(1, len(ids) - m)
            ids += ids[start : start + m]
            marks += [0] + [1] * (m - 1)
        else:
            text = " " + evaltasks.sentences(rng, 1)[0]
            if rng.random() < 0.5:
                text += f" {rng.randrange(10**4, 10**5)}."
            piece = tok.encode(text, add_special_tokens=False)
            ids += piece
            marks += [0] * len(piece)
    return ids[:budget], marks[:budget]


def batches(tok, recipe: dict):
    """Yield (input_ids, weights) tensors, one batch per step, deterministic from the recipe's seed."""
    import torch

    rng = random.Random(TRAIN_SEED_BASE + recipe["seed"])
    for step in range(recipe["steps"]):
        budget = _budget(step, recipe["steps"], rng, recipe)
        rows = []
        for _ in range(recipe["batch"]):
            draw = rng.random()
            if draw < recipe["copy_fraction"]:
                row, marks = _copy_example(tok, budget, rng)
            else:
                kind = "multikey" if draw < recipe["copy_fraction"] + recipe["multikey_fraction"] else "passkey"
                row, start = _example(tok, kind, budget, rng)
                marks = [0] * start + [1] * (len(row) - start)
            rows.append((row, marks))
        width = max(len(row) for row, _ in rows)
        ids = torch.full((len(rows), width), tok.eos_token_id, dtype=torch.long)
        weights = torch.zeros((len(rows), width))
        for i, (row, marks) in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            w = torch.tensor([recipe["answer_weight"] if m else recipe["text_weight"] for m in marks])
            w[0] = 0.0  # position t is predicted from < t: nothing predicts the first token
            weights[i, : len(row)] = w
        yield ids, weights


def train(model, tok, recipe: dict = RECIPE, log=None) -> list[dict]:
    """Train in place; the loss curve, one point per 10 steps: step, loss (weighted), answer loss."""
    import torch

    torch.manual_seed(recipe["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], betas=tuple(recipe["betas"]),
                            weight_decay=recipe["weight_decay"])
    steps, warm = recipe["steps"], recipe["warmup"]

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        cos = 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
        return recipe["min_lr_ratio"] + (1 - recipe["min_lr_ratio"]) * cos

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    curve: list[dict] = []
    model.train()
    acc_loss = acc_ans = 0.0
    for step, (ids, weights) in enumerate(batches(tok, recipe)):
        logits = model(input_ids=ids).logits[:, :-1].float()
        target, w = ids[:, 1:], weights[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                reduction="none").view_as(target)
        loss = (nll * w).sum() / w.sum()
        ans = w >= recipe["answer_weight"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["grad_clip"])
        opt.step()
        sched.step()
        acc_loss += loss.item()
        acc_ans += (nll[ans].mean().item() if ans.any() else 0.0)
        if (step + 1) % 10 == 0:
            point = {"step": step + 1, "loss": round(acc_loss / 10, 4), "answer_loss": round(acc_ans / 10, 4),
                     "prompt_tokens": int(ids.shape[1])}
            curve.append(point)
            acc_loss = acc_ans = 0.0
            if log:
                log(f"step {point['step']}/{steps}: loss {point['loss']:.3f}, answer loss {point['answer_loss']:.3f}")
    model.eval()
    return curve


def accuracy(model, tok, task: str, n: int) -> dict:
    """Greedy exact match on the first `n` evaluation items of `task` (the items kvbench eval uses)."""
    import torch

    items = evaltasks.generate(task, tok, n)
    correct = 0
    with torch.no_grad():
        for item in items:
            ids = torch.tensor([tok.encode(item.prompt)])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=evaltasks.KEY_DIGITS + 2,
                                 do_sample=False, pad_token_id=tok.eos_token_id)
            text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            correct += evaltasks.score(text, item.answer)
    return {"task": task, "n": n, "correct": correct, "exact_match": correct / n}


def build(path: Path, log=None) -> dict:
    """Tokenizer + trained model + training_report.json into `path`; returns the report."""
    import torch
    import transformers
    from transformers import LlamaForCausalLM

    t0 = time.monotonic()
    threads = torch.get_num_threads()
    torch.set_num_threads(RECIPE["threads"])
    try:
        tok = tinymodel.build_tokenizer(path)
        t_tok = time.monotonic() - t0
        torch.manual_seed(tinymodel.SEED)
        model = LlamaForCausalLM(tinymodel.llama_config(len(tok))).float()
        curve = train(model, tok, RECIPE, log)
        t_train = time.monotonic() - t0 - t_tok
        evals = [accuracy(model, tok, f"{evaltasks.PREFIX}passkey_{ctx}", n) for ctx, n in REPORT_ITEMS.items()]
        evals.append(accuracy(model, tok, f"{evaltasks.PREFIX}multikey_512", REPORT_ITEMS[512] // 2))
        t_eval = time.monotonic() - t0 - t_tok - t_train
        model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    finally:
        torch.set_num_threads(threads)
    report = {
        "model": tinymodel.NAME, "fingerprint": fingerprint(), "config": tinymodel.CONFIG, "recipe": RECIPE,
        "steps": RECIPE["steps"], "loss_curve": curve,
        "final_loss": curve[-1]["loss"] if curve else None,
        "wall_time_s": {"tokenizer": round(t_tok, 1), "train": round(t_train, 1), "eval": round(t_eval, 1),
                        "total": round(time.monotonic() - t0, 1)},
        "accuracy_fp32": evals,
        "eval_note": "greedy, fp32 weights, transformers; held-out items = the first n of kvbench eval's own items",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "threads": RECIPE["threads"],
    }
    (path / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
