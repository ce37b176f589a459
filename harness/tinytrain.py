"""Training the CPU default's tiny Llama to retrieve pass keys, so that its accuracy means something: at `auto`
it answers kvbench's pass-key task, and a KV cache that loses fidelity can make it fail.

It learns on the task distribution itself (kvbench.evaltasks with training seeds, never the evaluation
items): pseudo-English haystacks with one pass-key needle (or, less often, several named ones) at a random
depth and the question at the end, plus haystacks in which bare pass keys are written twice at random
distances (practice in copying digits in order). Loss is on every token, weighted up on what only
retrieval can predict (the answer, a key's second writing). Sequences are short first, then up to the CPU
default's context, with some longer ones.

Two layers learn retrieval by an induction circuit: a previous-token head in layer 0 and, in layer 1, a
head that finds "the token after the one I just wrote". The first half rarely forms within this budget
(the model then learns which digits the key has but not their order), so layer 0 starts with it
(`previous_token_prior`); the rest is learned.

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
    "steps": 1400,
    "batch": 16,
    "lr": 3e-3,
    "warmup": 40,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.01,
    "betas": [0.9, 0.98],
    "grad_clip": 1.0,
    "answer_weight": 1.0,  # loss weight of answer tokens and of a needle's second writing of its key
    "text_weight": 0.2,  # loss weight of the rest: the haystack is random words, mostly unpredictable
    "multikey_fraction": 0.1,
    "numbers_fraction": 0.4,  # examples that practise copying numbers in order (Assembler.numbers)
    # (fraction of training done, largest prompt budget in tokens) : budgets grow along this schedule
    "curriculum": [[0.0, 160], [0.55, 448]],
    "long_fraction": 0.15,  # share of the later steps at a longer budget (up to long_budget)
    "long_budget": 960,
    "threads": 2,
    "previous_token_prior": True,  # see previous_token_prior
    "prior_dim": 0,
    "prior_constant": 0.5,
    "prior_amplitude": 64.0,
    "prior_frequencies": 4,
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
    return [
        evaltasks.PASSKEY_INTRO,
        evaltasks.PASSKEY_NEEDLE,
        evaltasks.PASSKEY_QUESTION,
        evaltasks.MULTIKEY_INTRO,
        evaltasks.MULTIKEY_NEEDLE,
        evaltasks.MULTIKEY_QUESTION,
        str(evaltasks.KEY_DIGITS),
        str(evaltasks.MULTIKEY_KEYS),
    ]


def _budget(step: int, steps: int, rng: random.Random, recipe: dict) -> int:
    frac = step / max(1, steps)
    top = recipe["curriculum"][0][1]
    for at, budget in recipe["curriculum"]:
        if frac >= at:
            top = budget
    if recipe["long_fraction"] and frac >= 0.55 and rng.random() < recipe["long_fraction"]:
        return rng.randint(top, recipe["long_budget"])
    return rng.randint(top // 2, top)


class Assembler:
    """Builds training examples at the token level from pre-encoded sentences (encoding whole prompts per example
    would cost more than the training step). Token for token these are what evaltasks.make_item produces:
    every piece starts on a pre-token boundary (a space before a word, or a newline), so concatenated
    encodings equal the encoding of the concatenated text, up to where a prompt is cut to its budget."""

    def __init__(self, tok, rng: random.Random, pool: int = 4000):
        self.tok = tok
        self.enc = lambda text: tok.encode(text, add_special_tokens=False)
        sents = evaltasks.sentences(rng, pool)
        self.bare = [self.enc(x) for x in sents]  # the first sentence after the intro's newline
        self.spaced = [self.enc(" " + x) for x in sents]
        self.digits = {tok.convert_tokens_to_ids(str(d)) for d in range(10)}

    def numbers(self, budget: int, rng: random.Random) -> tuple[list[int], list[int]]:
        """Haystack with a few pass keys written bare, each written again later at a random distance: every digit
        of a second writing after its first is predictable only by finding the first writing and copying in
        order (what an induction head does). Dense practice of exactly the step retrieval needs."""
        ids, marks = [self.tok.bos_token_id], [0]
        pending: list[list[int]] = []
        while len(ids) < budget:
            draw = rng.random()
            if draw < 0.2:
                piece = self.enc(" " + evaltasks.key(rng))
                pending.append(piece)
                ids += piece
                marks += [0] * len(piece)
            elif draw < 0.4 and pending:
                piece = pending.pop(rng.randrange(len(pending)))
                ids += piece
                marks += [0, 0] + [1] * (len(piece) - 2)  # the space and the first digit are not predictable
            else:
                piece = self.spaced[rng.randrange(len(self.spaced))]
                ids += piece
                marks += [0] * len(piece)
        return ids[:budget], marks[:budget]

    def example(self, kind: str, budget: int, rng: random.Random) -> tuple[list[int], list[int]]:
        """(BOS + prompt + " 12345." + EOS, 0/1 marks of the tokens to learn with answer weight: the answer,
        and in a pass-key needle the key's second writing, which only copying can predict)."""
        if kind == "passkey":
            key = evaltasks.key(rng)
            needles = [evaltasks.PASSKEY_NEEDLE.format(key=key)]
            intro, question, answer, depths = evaltasks.PASSKEY_INTRO, evaltasks.PASSKEY_QUESTION, key, [rng.random()]
        else:
            budget = max(budget, MULTIKEY_MIN_BUDGET)  # four needles and the question alone take ~100 tokens
            names = rng.sample(evaltasks.words(), evaltasks.MULTIKEY_KEYS)
            keys = [evaltasks.key(rng) for _ in names]
            needles = [evaltasks.MULTIKEY_NEEDLE.format(name=n, key=k) for n, k in zip(names, keys, strict=True)]
            asked = rng.randrange(len(names))
            intro, answer = evaltasks.MULTIKEY_INTRO, keys[asked]
            question = evaltasks.MULTIKEY_QUESTION.format(name=names[asked])
            depths = [rng.random() for _ in names]
        head, tail = self.enc(intro), self.enc(question)
        spaced_needles = [self.enc(" " + n) for n in needles]
        room = budget - len(head) - len(tail) - sum(map(len, spaced_needles))
        chosen: list[int] = []
        while room > 0:
            i = rng.randrange(len(self.spaced))
            if len(self.spaced[i]) > room:
                break
            chosen.append(i)
            room -= len(self.spaced[i])
        units: list[tuple[str, int]] = [("s", i) for i in chosen]
        for depth, j in sorted(zip(depths, range(len(needles)), strict=True), key=lambda p: -p[0]):
            units.insert(round(depth * len(chosen)), ("n", j))
        ids, marks = [self.tok.bos_token_id, *head], [0] * (1 + len(head))
        for pos, (what, j) in enumerate(units):
            if what == "s":
                piece, piece_marks = (self.bare if pos == 0 else self.spaced)[j], None
            else:
                piece = self.enc(needles[j]) if pos == 0 else spaced_needles[j]
                digit_at = [k for k, t in enumerate(piece) if t in self.digits]
                second = set(digit_at[evaltasks.KEY_DIGITS :]) if kind == "passkey" else set()
                piece_marks = [int(k in second) for k in range(len(piece))]
            ids += piece
            marks += piece_marks or [0] * len(piece)
        ids += tail
        marks += [0] * len(tail)
        ans = self.enc(" " + answer + ".") + [self.tok.eos_token_id]
        return ids + ans, marks + [1] * len(ans)


def batches(tok, recipe: dict):
    """Yield (input_ids, weights) tensors, one batch per step, deterministic from the recipe's seed."""
    import torch

    rng = random.Random(TRAIN_SEED_BASE + recipe["seed"])
    assembler = Assembler(tok, rng)
    for step in range(recipe["steps"]):
        budget = _budget(step, recipe["steps"], rng, recipe)
        rows = []
        for _ in range(recipe["batch"]):
            draw = rng.random()
            if draw < recipe["numbers_fraction"]:
                rows.append(assembler.numbers(budget, rng))
            else:
                kind = "multikey" if draw < recipe["numbers_fraction"] + recipe["multikey_fraction"] else "passkey"
                rows.append(assembler.example(kind, budget, rng))
        width = max(len(row) for row, _ in rows)
        ids = torch.full((len(rows), width), tok.eos_token_id, dtype=torch.long)
        weights = torch.zeros((len(rows), width))
        for i, (row, marks) in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            w = torch.tensor([recipe["answer_weight"] if m else recipe["text_weight"] for m in marks])
            w[0] = 0.0  # position t is predicted from < t: nothing predicts the first token
            weights[i, : len(row)] = w
        yield ids, weights


def previous_token_prior(model, recipe: dict = RECIPE) -> None:
    """Start layer 0's first KV head group as previous-token heads (query head 0 attends 1 token back, query
    head 1 two back), the half of an induction circuit that plain training on this budget does not find.

    One embedding dimension is made constant (and kept so), so after RMSNorm the input carries a
    token-independent component; those heads' query and key read only it, so their scores depend on
    position alone. With RoPE (neox layout: dims i and i + d/2 rotate together at theta_i), a query
    sqrt(A)·e^(-j·lag·theta_i) against a key sqrt(A) gives A·cos((distance - lag)·theta_i) per frequency:
    summed over the 4 fastest frequencies, a kernel peaked at `lag` at every context length up to 4096.
    Everything else, including what these heads copy, is learned."""
    import torch

    cfg = model.config
    d, dim = cfg.head_dim, recipe["prior_dim"]
    theta = tinymodel.CONFIG["rope_theta"] ** (-torch.arange(d // 2, dtype=torch.float64) * 2 / d)
    amp = recipe["prior_amplitude"] ** 0.5
    emb = model.model.embed_tokens.weight
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        emb[:, dim] = recipe["prior_constant"]
        emb.register_hook(lambda g: g.index_fill(1, torch.tensor([dim]), 0.0))  # the constant stays constant
        # What the normalized constant dimension reads, on average over the vocabulary (RMSNorm weight is 1).
        level = float((emb[:, dim] / emb.pow(2).mean(1).sqrt()).mean())
        # Only the fastest rotating pairs: slow ones add the same to every nearby score and would let the
        # token-to-token spread of the normalized constant swamp the difference between lags.
        used = torch.zeros(d // 2, dtype=torch.float64)
        used[: recipe["prior_frequencies"]] = 1.0
        k = torch.cat([amp * used, torch.zeros(d // 2, dtype=torch.float64)])
        attn.k_proj.weight[:d].zero_()
        attn.k_proj.weight[:d, dim] = (k / level).float()  # KV head 0
        for head, lag in ((0, 1), (1, 2)):  # the query heads that share KV head 0
            q = torch.cat([amp * used * torch.cos(lag * theta), -amp * used * torch.sin(lag * theta)])
            rows = slice(head * d, (head + 1) * d)
            attn.q_proj.weight[rows].zero_()
            attn.q_proj.weight[rows, dim] = (q / level).float()


def train(model, tok, recipe: dict = RECIPE, log=None, stop_after: int | None = None) -> list[dict]:
    """Train in place; the loss curve, one point per 10 steps: step, loss (weighted), answer loss.
    `stop_after`: end after that many steps (the schedule is still the full recipe's: a rerun's prefix)."""
    import torch

    torch.manual_seed(recipe["seed"])
    if recipe["previous_token_prior"]:
        previous_token_prior(model, recipe)
    opt = torch.optim.AdamW(
        model.parameters(), lr=recipe["lr"], betas=tuple(recipe["betas"]), weight_decay=recipe["weight_decay"]
    )
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
        if stop_after is not None and step >= stop_after:
            break
        logits = model(input_ids=ids).logits[:, :-1].float()
        target, w = ids[:, 1:], weights[:, 1:]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none"
        ).view_as(target)
        loss = (nll * w).sum() / w.sum()
        ans = w >= recipe["answer_weight"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["grad_clip"])
        opt.step()
        sched.step()
        acc_loss += loss.item()
        acc_ans += nll[ans].mean().item() if ans.any() else 0.0
        if (step + 1) % 10 == 0:
            point = {
                "step": step + 1,
                "loss": round(acc_loss / 10, 4),
                "answer_loss": round(acc_ans / 10, 4),
                "prompt_tokens": int(ids.shape[1]),
            }
            curve.append(point)
            acc_loss = acc_ans = 0.0
            if log and (step + 1) % 100 == 0:
                log(
                    f"training the tiny model: step {point['step']}/{steps}, loss {point['loss']:.3f}, "
                    f"answer loss {point['answer_loss']:.3f}"
                )
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
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=evaltasks.KEY_DIGITS + 2,
                do_sample=False,
                pad_token_id=tok.eos_token_id,
            )
            text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
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
        "model": tinymodel.NAME,
        "fingerprint": fingerprint(),
        "config": tinymodel.CONFIG,
        "recipe": RECIPE,
        "steps": RECIPE["steps"],
        "loss_curve": curve,
        "final_loss": curve[-1]["loss"] if curve else None,
        "wall_time_s": {
            "tokenizer": round(t_tok, 1),
            "train": round(t_train, 1),
            "eval": round(t_eval, 1),
            "total": round(time.monotonic() - t0, 1),
        },
        "accuracy_fp32": evals,
        "eval_note": "greedy, fp32 weights, transformers; held-out items = the first n of kvbench eval's own items",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "threads": RECIPE["threads"],
    }
    (path / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
