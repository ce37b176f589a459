"""Training the CPU default's tiny Llama on kvbench's own tasks, so that its accuracy means something: at `auto`
it answers most items of each quality task, and a KV cache that loses fidelity can make it fail.

It learns on the task distributions themselves (kvbench.specs.evaltasks.parts with training seeds, never the
evaluation items), with the knobs varied around each task's setting: pseudo-English haystacks with a long
pass key, with many named keys (several of them asked in turn), with a number updated several times, pass-key
items, and haystacks in which bare numbers are written twice at random distances (practice in copying digits
in order). Loss is on every token, weighted up on what only the context can predict (answers, a number's
second writing). The first quarter is mostly easy copying (bare numbers, pass keys written twice), where the
induction circuit forms; then every task. Prompts are short first, then up to the CPU default's context.

Layer 0's first KV head starts with two previous-token heads (`previous_token_prior`): the half of an
induction circuit that plain training on this budget rarely forms; the rest, including what those heads are
used for, is learned.

Deterministic: seeded data and init, a fixed thread count (CPU reductions depend on it), fp32 training. On
one machine and software stack a rerun gives the same bits; another CPU (another vector width, so other
summation orders in the matrix kernels) or another torch can round differently, and the differences grow over
the steps. That is why the weights are committed: the committed file, not a rerun, is what makes machines
agree. The report (`training_report.json`) holds the recipe, the loss curve, wall time, versions, and the
accuracy of the saved (bf16) weights in torch on each task's first evaluation items.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import random
import time
from pathlib import Path

from kvbench.core.datafiles import load_toml
from kvbench.core.tinyconfig import CONFIG, NAME
from kvbench.specs import evaltasks
from kvbench.tinymodel import build as tinymodel

# Everything that shapes the trained weights; part of the fingerprint.
RECIPE = load_toml("tinymodel.toml")["train"]
# Items per task in the report: the trained (bf16) weights in torch, auto only (tinyeval measures the rest).
REPORT_TASKS = ("kvbench_needle_512", "kvbench_manykeys_512", "kvbench_track_512", "kvbench_passkey_512")
REPORT_ITEMS = 200
TRAIN_SEED_BASE = 10_000  # evaluation items use evaltasks.SEED; training never draws from it


def fingerprint(recipe: dict | None = None) -> str:
    recipe = RECIPE if recipe is None else recipe
    blob = json.dumps(
        {"model": tinymodel.fingerprint(), "train": recipe, "tasks": evaltasks.wording()},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _budget(step: int, steps: int, rng: random.Random, recipe: dict) -> int:
    frac = step / max(1, steps)
    top = recipe["curriculum"][0][1]
    for at, budget in recipe["curriculum"]:
        if frac >= at:
            top = budget
    return rng.randint(top // 2, top)


def _mix(step: int, recipe: dict) -> dict[str, float]:
    """The row kinds' shares at this step: the last phase of recipe["mix"] that has begun."""
    frac = step / max(1, recipe["steps"])
    mix = recipe["mix"][0][1]
    for at, shares in recipe["mix"]:
        if frac >= at:
            mix = shares
    return mix


class Examples:
    """Training rows as token ids with 0/1 marks of the tokens learned at answer weight."""

    def __init__(self, tok, recipe: dict, rng: random.Random, pool: int = 4000):
        self.tok, self.recipe = tok, recipe
        self.enc = lambda text: tok.encode(text, add_special_tokens=False)
        self.spaced = [self.enc(" " + x) for x in evaltasks.sentences(rng, pool)]
        self.digit = {d: tok.convert_tokens_to_ids(d) for d in "0123456789"}
        self.space = self.enc(" ")

    def number(self, digits: str) -> list[int]:
        return self.space + [self.digit[d] for d in digits]

    def numbers(self, budget: int, rng: random.Random) -> tuple[list[int], list[int]]:
        """Haystack with bare numbers (pass keys, and long keys with repeats), each written again later at a random
        distance: every digit of a second writing after its first is predictable only by finding the first
        writing and copying in order (what an induction head does). Dense practice of the step retrieval needs."""
        ids, marks = [self.tok.bos_token_id], [0]
        pending: list[list[int]] = []
        lo, hi = self.recipe["needle_digits"]
        while len(ids) < budget:
            draw = rng.random()
            if draw < 0.2:
                # half pass keys (distinct digits: each digit's successor unique), half long keys with repeats
                long = rng.random() < self.recipe["numbers_long_share"]
                digits = evaltasks.long_key(rng, rng.randint(lo, hi)) if long else evaltasks.key(rng)
                piece = self.number(digits)
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

    def _repeats(self, ids: list[int]) -> list[int]:
        """1 on the digits of a number written before in the row, after its first digit (a pass-key needle
        writes its key twice): only copying predicts them."""
        marks = [0] * len(ids)
        digits = set(self.digit.values())
        seen: set[tuple[int, ...]] = set()
        i = 0
        while i < len(ids):
            if ids[i] in digits:
                j = i
                while j < len(ids) and ids[j] in digits:
                    j += 1
                run = tuple(ids[i:j])
                if run in seen:
                    marks[i + 1 : j] = [1] * (j - i - 1)
                seen.add(run)
                i = j
            else:
                i += 1
        return marks

    def task(self, kind: str, budget: int, rng: random.Random) -> tuple[list[int], list[int]]:
        """A task item filled to about `budget` prompt tokens, then its answer (and, for named keys, more
        questions about the same haystack with their answers), then EOS."""
        r = self.recipe
        knobs = {
            "digits": rng.randint(*r["needle_digits"]),
            "keys": rng.randint(*r["manykeys_keys"]),
            "updates": rng.randint(*r["track_updates"]),
            "change": 0,  # fresh values at every update, whatever the task's own setting
        }
        p = evaltasks.parts(kind, budget, rng.random(), rng, **knobs)
        fixed = len(self.enc(p.build(0)))
        lengths = [len(x) for x in self.tok(p.pool, add_special_tokens=False)["input_ids"]]
        n, used = 0, fixed
        while n < len(p.pool) and used + lengths[n] + 1 <= budget:  # + 1: the space before it
            used += lengths[n] + 1
            n += 1
        ids = [self.tok.bos_token_id, *self.enc(p.build(n))]
        marks = self._repeats(ids)
        qa = [(p.question, p.answer)]
        if p.others:
            qa += rng.sample(p.others, min(len(p.others), r["questions"] - 1))
        for i, (question, answer) in enumerate(qa):
            if i:
                q = self.enc(question)
                ids += q
                marks += [0] * len(q)
            a = self.enc(evaltasks.continuation(kind, answer) + ".")
            ids += a
            marks += [1] * len(a)
        ids.append(self.tok.eos_token_id)
        marks.append(1)
        return ids, marks


def batches(tok, recipe: dict = RECIPE):
    """Yield (input_ids, weights) tensors, one batch per step, deterministic from the recipe's seed."""
    import torch

    rng = random.Random(TRAIN_SEED_BASE + recipe["seed"])
    examples = Examples(tok, recipe, rng)
    for step in range(recipe["steps"]):
        budget = _budget(step, recipe["steps"], rng, recipe)
        mix = _mix(step, recipe)
        rows = []
        for _ in range(recipe["batch"]):
            kind = rng.choices(list(mix), list(mix.values()))[0]
            rows.append(examples.numbers(budget, rng) if kind == "numbers" else examples.task(kind, budget, rng))
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
    """Start layer 0's first KV head group as previous-token heads: query head i attends `prior_lags[i]` tokens
    back, the half of an induction circuit that plain training on this budget does not find.

    One embedding dimension is made constant (and kept so), so after RMSNorm the input carries a
    token-independent component; those heads' query and key read only it, so their scores depend on
    position alone. With RoPE (neox layout: dims i and i + d/2 rotate together at theta_i), a query
    sqrt(A)·e^(-j·lag·theta_i) against a key sqrt(A) gives A·cos((distance - lag)·theta_i) per frequency:
    summed over the 4 fastest frequencies, a kernel peaked at `lag` at every context length up to 4096.
    Everything else, including what these heads copy, is learned."""
    import torch

    cfg = model.config
    d, dim = cfg.head_dim, recipe["prior_dim"]
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    lags = recipe["prior_lags"]
    if len(lags) > group:
        raise ValueError(f"{len(lags)} prior lags, but a KV head has {group} query heads")
    theta = CONFIG["rope_theta"] ** (-torch.arange(d // 2, dtype=torch.float64) * 2 / d)
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
        for head, lag in enumerate(lags):  # the query heads that share KV head 0
            q = torch.cat([amp * used * torch.cos(lag * theta), -amp * used * torch.sin(lag * theta)])
            rows = slice(head * d, (head + 1) * d)
            attn.q_proj.weight[rows].zero_()
            attn.q_proj.weight[rows, dim] = (q / level).float()


def new_model(tok):
    """The untrained model: seeded init (fp32), as the recipe starts from it."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(tinymodel.SEED)
    return LlamaForCausalLM(tinymodel.llama_config(len(tok))).float()


def train(model, tok, recipe: dict = RECIPE, log=None, stop_after: int | None = None, checkpoint=None) -> list[dict]:
    """Train in place; the loss curve, one point per 10 steps: step, loss (weighted), answer loss.
    `stop_after`: end after that many steps (the schedule is still the full recipe's: a rerun's prefix).
    `checkpoint(step, model)`: called every 250 steps (exploration; it must not touch the model)."""
    import torch

    torch.manual_seed(recipe["seed"])
    if recipe["prior_lags"]:
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
    t0 = time.monotonic()
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
            if log and (step + 1) % 50 == 0:
                log(
                    f"training the tiny model: step {point['step']}/{steps}, loss {point['loss']:.3f}, "
                    f"answer loss {point['answer_loss']:.3f}, {time.monotonic() - t0:.0f} s"
                )
        if checkpoint and (step + 1) % 250 == 0:
            model.eval()
            checkpoint(step + 1, model)
            model.train()
    model.eval()
    return curve


def build(path: Path, log=None, recipe: dict = RECIPE, report_items: int = REPORT_ITEMS, checkpoint=None) -> dict:
    """Tokenizer + trained model (bf16 safetensors) + training_report.json into `path`; returns the report."""
    import torch
    import transformers

    from kvbench.specs.machine import machine_name
    from kvbench.tinymodel import scoring

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe["threads"])
    try:
        tok = tinymodel.build_tokenizer(path)
        t_tok = time.monotonic() - t0
        model = new_model(tok)
        curve = train(model, tok, recipe, log, checkpoint=checkpoint)
        t_train = time.monotonic() - t0 - t_tok
        tinymodel.save(model, path)
        # The report measures what is saved: the bf16 weights, loaded back as a server would.
        evals = []
        if report_items:
            served, served_tok = scoring.load(path)
            evals = [s.summary() for s in scoring.measure(served, served_tok, REPORT_TASKS, report_items, ["auto"])]
        t_eval = time.monotonic() - t0 - t_tok - t_train
    finally:
        torch.set_num_threads(threads)
    report = {
        "model": NAME,
        "fingerprint": fingerprint(recipe),
        "config": CONFIG,
        "recipe": recipe,
        "steps": recipe["steps"],
        "loss_curve": curve,
        "final_loss": curve[-1]["loss"] if curve else None,
        "wall_time_s": {
            "tokenizer": round(t_tok, 1),
            "train": round(t_train, 1),
            "eval": round(t_eval, 1),
            "total": round(time.monotonic() - t0, 1),
        },
        "accuracy_bf16": evals,
        "eval_note": "greedy, the saved bf16 weights in transformers (kvbench.tinymodel.scoring), KV auto; "
        "items = the first n of kvbench eval's own",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "machine": machine_name(),
        "threads": recipe["threads"],
    }
    (path / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
