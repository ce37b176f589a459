"""Claims: each article claim re-derived with an honest verdict."""

import pytest

from kvbench.claims import evaluate, load_claims
from kvbench.errors import UsageError


@pytest.fixture(scope="module")
def verdicts():
    return {v.id: v for v in evaluate(load_claims())}


def test_every_claim_gets_a_verdict(verdicts):
    assert len(verdicts) >= 20
    assert all(v.verdict in ("holds", "off", "fails", "not checkable") for v in verdicts.values())
    assert all(v.derivation for v in verdicts.values())


@pytest.mark.parametrize(
    "claim, verdict, derived",
    [
        ("bytes-fp16", "holds", 2.0),
        ("bytes-nvfp4", "fails", 0.5625),  # block scales: +12.5%
        ("users-fp16-4k", "holds", 104),
        ("users-nvfp4-4k", "fails", 370),
        ("4x-users", "fails", 370 / 104),
        ("gpus-fp16-400", "holds", 4),
        ("gpus-nvfp4-400", "fails", 2),
        ("fp8-54pct", "off", 0.5),
    ],
)
def test_verdicts(verdicts, claim, verdict, derived):
    v = verdicts[claim]
    assert v.verdict == verdict
    assert v.derived == pytest.approx(derived)


def test_external_claims_are_not_checkable(verdicts):
    assert verdicts["price-a100-h100-h200"].verdict == "not checkable"
    assert verdicts["price-a100-h100-h200"].derived is None


def test_measured_values_are_carried(verdicts):
    doc = load_claims()
    out = {v.id: v for v in evaluate(doc, measured={"4x-users": 2.0})}
    assert out["4x-users"].measured == 2.0
    assert verdicts["4x-users"].measure == "engine_capacity_ratio"


def test_bad_claims_files(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[[claims]]\nid='x'\ntext='t'\nquantity='users'\n")
    with pytest.raises(UsageError, match="lacks 'claimed'"):
        load_claims(f)
    f.write_text("[[claims]]\nid='x'\ntext='t'\nquantity='vibes'\nclaimed=1\n")
    with pytest.raises(UsageError, match="choose from"):
        load_claims(f)
    with pytest.raises(UsageError, match="not found"):
        load_claims(tmp_path / "missing.toml")
