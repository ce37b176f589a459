"""README's measured numbers come from the committed records it names (issue 42 part 5, issue 46 part 6).

Each record README names (`results/<machine>/runs/<id>.json`) is read and decided here the way `kvbench report`
does; the figures README quotes from it are formatted from the record in code and must each appear in README.
A number edited by hand, or a paragraph left behind when a newer record replaces the old one, fails here.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest

from kvbench.analysis.verdict import decide
from kvbench.analysis.verdict_accuracy import INFERIOR
from kvbench.records.storage import load_record, read_record

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
NAMED = re.compile(r"results/[a-z0-9-]+/runs/\d{8}T\d{6}Z-[a-z0-9-]+\.json")


def sig3(x: float) -> str:
    """Three significant digits, trailing zeros kept (0.0250, 0.00495): how README writes a KLD."""
    return f"{x:#.3g}"


def quoted_facts(path: Path) -> list[str]:
    """The figures README quotes from one record, formatted as README writes them."""
    record, doc = read_record(path), load_record(path)
    decision = decide(record)
    by_dtype = {d["kv_cache_dtype"]: d for d in doc["dtypes"]}
    ref = ((by_dtype.get("auto") or {}).get("capacity") or {}).get("engine") or {}
    facts = [f"recommends {decision.recommended}"]
    took = (datetime.fromisoformat(doc["finished_at"]) - datetime.fromisoformat(doc["created_at"])).total_seconds()
    facts.append(f"{int(took // 60)} min {int(took % 60)} s")
    for dtype, d in by_dtype.items():
        engine = (d.get("capacity") or {}).get("engine") or {}
        if engine.get("kv_tokens"):
            facts.append(f"{engine['kv_tokens']:,}")
            if ref.get("kv_tokens") and dtype != "auto":
                facts.append(f"{engine['kv_tokens'] / ref['kv_tokens']:.2f}x")
        rest = (d.get("fidelity") or {}).get("rest")
        if rest:
            lo, hi = rest["mean_kld_ci"]
            facts += [f"{sig3(rest['mean_kld'])} [{sig3(lo)}, {sig3(hi)}]", f"{100 * rest['top1_agreement']:.1f}%"]
            facts.append(f"{rest['tokens']:,}")
        torch_floor = (d.get("fidelity") or {}).get("torch")  # vLLM against transformers at the model dtype
        if torch_floor:
            facts.append(sig3(torch_floor["mean_kld"]))
        seq = ((d.get("eval") or {}).get("rest") or {}).get("sequential")
        if seq and seq.get("looks"):  # the looks the pooled comparison took, and why it stopped
            if seq.get("decision") != "undecided":
                looks = seq["looks"]
                facts += [f"look {len(looks)} of {len(seq['planned_items'])}", f"{looks[-1]['items']:,} items"]
            if seq.get("stopped"):
                facts.append(re.search(r"about [\d,]+ items", seq["stopped"]).group(0))
        verdict = decision.dtypes[dtype]
        primary = getattr(verdict, "accuracy", None) and verdict.accuracy.primary
        if primary is not None:
            r = primary.result
            bound = -r.upper if r.verdict == INFERIOR else -r.lower
            facts += [
                f"{100 * primary.accuracy:.1f}%",
                f"{100 * primary.reference_accuracy:.1f}%",
                f"drop {primary.drop:.1f} points",
                f"bound {100 * bound:.1f}",
            ]
    return facts


def named_records() -> list[str]:
    return sorted(set(NAMED.findall(README.read_text())))


def test_readme_names_committed_records():
    named = named_records()
    assert named, "README quotes measured numbers without naming the record that holds them"
    for rel in named:
        assert (ROOT / rel).is_file(), f"README names {rel}, which is not committed"


@pytest.mark.parametrize("rel", named_records())
def test_every_figure_readme_quotes_is_in_its_record(rel):
    text = " ".join(README.read_text().split())  # a figure may wrap across lines
    missing = [f for f in quoted_facts(ROOT / rel) if f not in text]
    assert not missing, f"README's paragraph on {rel} lacks (or misquotes) {missing}"
