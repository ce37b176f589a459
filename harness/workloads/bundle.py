"""The bundled offline workload data: a small ShareGPT-format file, a small JSONL request file and a small
Mooncake-style trace, generated deterministically so the CPU default and CI run every workload kind with
nothing downloaded.

    python -m kvbench.harness.workloads.bundle            # rewrite kvbench/data/workloads/, print the stats
    python -m kvbench.harness.workloads.bundle --check    # exit 1 if regenerating would change a byte

What they follow and why is data (kvbench/data/workloads/bundle.toml): ShareGPT's published mean prompt and
output lengths (Kwon et al., SOSP 2023, the vLLM paper: 161.31 and 337.99 tokens) scaled by 512 / 2048 — the
CPU default's max_model_len over vLLM's ShareGPT filter limit — with lognormal shapes whose sigmas are
kvbench's assumption (the paper reports only the means). Lengths are in the tiny CPU model's tokens: texts
are pseudo-English sentences from its training corpus, trimmed and padded with one-token words to the drawn
length exactly. The trace uses Mooncake's record format with 64-token blocks (512 in Mooncake's traces, too
big for a 512-token context) and Poisson arrivals.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.core.datafiles import data_path, load_toml

RECIPE = "workloads/bundle.toml"


def recipe() -> dict[str, Any]:
    return load_toml(RECIPE)


def lognormal_mu(mean: float, sigma: float) -> float:
    """mu of the lognormal with this mean and sigma."""
    return math.log(mean) - sigma**2 / 2


# --- text of an exact length ------------------------------------------------------------------------


class _Texts:
    """Pseudo-English text of exactly n tokens (the tokenizer's own count, as vLLM counts a ShareGPT turn)."""

    def __init__(self, tok, rng: np.random.Generator):
        from kvbench.harness.client.workload import _single_token_words
        from kvbench.tinymodel.build import corpus

        self.tok, self.rng = tok, rng
        self.sentences = corpus()
        self.fillers = _single_token_words(tok)

    def count(self, text: str) -> int:
        return len(self.tok(text).input_ids)

    def make(self, n: int) -> str:
        words: list[str] = []
        while self.count(" ".join(words)) < n:
            words += self.sentences[int(self.rng.integers(len(self.sentences)))].split()
        while words and self.count(" ".join(words)) > n:
            words.pop()
        while self.count(" ".join(words)) < n:
            words.append(self.fillers[int(self.rng.integers(len(self.fillers)))])
        text = " ".join(words)
        if self.count(text) != n:  # a tokenizer whose counts are not additive over words
            raise RuntimeError(f"could not build a text of exactly {n} tokens")
        return text


# --- ShareGPT ---------------------------------------------------------------------------------------


def _pairs(rng: np.random.Generator, n: int, r: dict) -> list[tuple[int, int]]:
    """(prompt, reply) lengths: lognormal, redrawn until both pass vLLM's filter and fit max_total_tokens."""
    mu_in, mu_out = lognormal_mu(r["input_mean"], r["input_sigma"]), lognormal_mu(r["output_mean"], r["output_sigma"])
    out = []
    while len(out) < n:
        p = int(np.rint(rng.lognormal(mu_in, r["input_sigma"])))
        o = int(np.rint(rng.lognormal(mu_out, r["output_sigma"])))
        if p >= r["min_tokens"] and o >= r["min_tokens"] and p + o <= r["max_total_tokens"]:
            out.append((p, o))
    return out


def sharegpt(tok) -> bytes:
    r = recipe()["sharegpt"]
    rng = np.random.default_rng(r["seed"])
    texts = _Texts(tok, rng)
    entries = []
    rounds = rng.choice(len(r["rounds"]), size=r["conversations"], p=r["rounds"]) + 1
    for i in range(r["conversations"]):
        conv = []
        for p, o in _pairs(rng, int(rounds[i]), r):
            conv += [{"from": "human", "value": texts.make(p)}, {"from": "gpt", "value": texts.make(o)}]
        entries.append({"id": f"kvb{i:04d}_0", "conversations": conv})
    # Rows vLLM's loader must skip, as real ShareGPT has them: a lone human turn (fewer than 2 turns) and
    # replies under 4 tokens (is_valid_sequence).
    for j in range(r["single_turn_entries"]):
        lone = [{"from": "human", "value": texts.make(20 + j)}]
        entries.append({"id": f"kvb{len(entries):04d}_0", "conversations": lone})
    for j in range(r["short_reply_entries"]):
        entries.append(
            {
                "id": f"kvb{len(entries):04d}_0",
                "conversations": [
                    {"from": "human", "value": texts.make(12 + j)},
                    {"from": "gpt", "value": texts.make(1 + j % 3)},
                ],
            }
        )
    order = rng.permutation(len(entries))
    lines = ",\n".join(json.dumps(entries[k], ensure_ascii=True) for k in order)
    return f"[\n{lines}\n]\n".encode()


# --- JSONL ------------------------------------------------------------------------------------------


def jsonl(tok) -> bytes:
    """vLLM's custom format ({"prompt": text, "output_tokens": n}) and token-count lines, alternating."""
    r = recipe()["jsonl"]
    rng = np.random.default_rng(r["seed"])
    texts = _Texts(tok, rng)
    lines = []
    for i, (p, o) in enumerate(_pairs(rng, r["lines"], recipe()["sharegpt"])):
        row = {"prompt": texts.make(p), "output_tokens": o} if i % 2 == 0 else {"prompt_tokens": p, "output_tokens": o}
        lines.append(json.dumps(row, ensure_ascii=True))
    return ("\n".join(lines) + "\n").encode()


# --- trace ------------------------------------------------------------------------------------------


def trace(tok=None) -> bytes:
    """Mooncake-style records: shared system-prompt chains (Zipf-popular), some requests continuing an earlier
    one's full blocks (a conversation's next turn), the rest unique; Poisson arrivals in whole ms."""
    r = recipe()["trace"]
    rng = np.random.default_rng(r["seed"])
    block = r["block_tokens"]
    next_id = 0
    roots = []
    for _ in range(r["roots"]):
        size = int(rng.integers(r["root_blocks_min"], r["root_blocks_max"] + 1))
        roots.append(list(range(next_id, next_id + size)))
        next_id += size
    popularity = 1.0 / np.arange(1, r["roots"] + 1)
    popularity /= popularity.sum()
    mu_in, mu_out = lognormal_mu(r["unique_mean"], r["unique_sigma"]), lognormal_mu(r["output_mean"], r["output_sigma"])
    t_ms, lines, history = 0.0, [], []
    for i in range(r["requests"]):
        if i:  # Mooncake's timestamps count from the first request
            t_ms += rng.exponential(1000.0 / r["rate_per_s"])
        output = int(min(max(np.rint(rng.lognormal(mu_out, r["output_sigma"])), 4), r["max_output_tokens"]))
        room = r["max_model_len"] - output
        u = rng.random()
        if history and u < r["continue_fraction"]:
            prev = history[int(rng.integers(len(history)))]
            shared = prev[1][: prev[0] // block]  # the earlier request's full blocks
        elif u < r["continue_fraction"] + r["root_fraction"]:
            shared = roots[int(rng.choice(r["roots"], p=popularity))]
        else:
            shared = []
        unique = max(1, int(np.rint(rng.lognormal(mu_in, r["unique_sigma"]))))
        if len(shared) * block + unique > room:
            shared = shared[: max(0, (room - unique) // block)]
            unique = min(unique, room - len(shared) * block)
        length = len(shared) * block + unique
        fresh = math.ceil(length / block) - len(shared)
        ids = list(shared) + list(range(next_id, next_id + fresh))
        next_id += fresh
        history.append((length, ids))
        row = {"timestamp": int(t_ms), "input_length": length, "output_length": output, "hash_ids": ids}
        lines.append(json.dumps(row))
    return ("\n".join(lines) + "\n").encode()


# --- files and their statistics ---------------------------------------------------------------------


def generate(tok) -> dict[str, bytes]:
    r = recipe()
    return {r["sharegpt"]["file"]: sharegpt(tok), r["jsonl"]["file"]: jsonl(tok), r["trace"]["file"]: trace(tok)}


def measure(tok, folder: Path | None = None) -> dict[str, dict[str, float]]:
    """The statistics bundle.toml's [*.measured] tables state, from the files in `folder`."""
    from kvbench.harness.workloads import build, parse_spec

    folder = folder or data_path("workloads")
    r = recipe()
    sg = build(parse_spec({"kind": "sharegpt", "path": str(folder / r["sharegpt"]["file"])}, "bundle"), tok)
    tr_table = {"kind": "trace", "path": str(folder / r["trace"]["file"]), "block_tokens": r["trace"]["block_tokens"]}
    tr_spec = parse_spec(tr_table, "bundle")
    tr = build(tr_spec, tok)
    entries = json.loads((folder / r["sharegpt"]["file"]).read_text())
    return {
        "sharegpt": {
            "entries": len(entries),
            "usable": len(sg),
            "bytes": (folder / r["sharegpt"]["file"]).stat().st_size,
            **_lengths(sg.stats),
        },
        "trace": {
            "requests": len(tr),
            "bytes": (folder / r["trace"]["file"]).stat().st_size,
            "duration_s": round(tr.stats["duration_s"], 3),
            **_lengths(tr.stats),
            "distinct_hash_ids": len({h for q in tr.requests for h in q.hash_ids}),
            "ideal_hit_rate": round(tr.prefix_reuse(r["trace"]["block_tokens"])["ideal_hit_rate"], 4),
        },
    }


def _lengths(stats: dict) -> dict[str, float]:
    out = {}
    for side, key in (("input", "prompt_tokens"), ("output", "output_tokens")):
        for q in ("mean", "p50", "p90", "p99", "max"):
            out[f"{side}_{q}"] = round(float(stats[key][q]), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kvbench.harness.workloads.bundle", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing them")
    ap.add_argument("--out", type=Path, default=None, help="folder to write (default: kvbench/data/workloads)")
    args = ap.parse_args(argv)
    from kvbench.core.tokenizer import load_tokenizer
    from kvbench.tinymodel.build import ensure_tiny_model

    tok = load_tokenizer(ensure_tiny_model())
    folder = args.out or data_path("workloads")
    files = generate(tok)
    if args.check:
        stale = [
            name
            for name, blob in files.items()
            if not (folder / name).is_file() or (folder / name).read_bytes() != blob
        ]
        print("bundled workload files are up to date" if not stale else f"stale: {', '.join(stale)}")
        return 1 if stale else 0
    folder.mkdir(parents=True, exist_ok=True)
    for name, blob in files.items():
        (folder / name).write_bytes(blob)
    for section, values in measure(tok, folder).items():
        print(f"[{section}.measured]")
        for k, v in values.items():
            print(f"{k} = {v}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
