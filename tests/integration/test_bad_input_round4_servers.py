"""Hostile input, round four (issue 42): servers whose logprobs lie, whose answers have the wrong shape, and
whose errors echo the credentials. The probe's cases (shared/notes/hostile-inputs-2026-12-06.md) as tests,
against the fake server's hostile answers (kvbench/testing/fakehostile.py):

- K-B18: NaN, +inf, positive logprobs, a token listed twice or spelled "13" and "013", a mass above 1 are
  refused with a reason naming the position (never a KLD of 0 or of millions of nats); N-P13: fewer than k
  logprobs, -inf, strings, non-integer ids, a body past what the request can need, a continuation longer
  than max_tokens or missing are named too; one condition's bad answers never lose the other's;
- K-B19: an agreement answer of the wrong shape is the agreement's ValueError, never the dtype's failure;
- K-B20, K-B16, N-P8: a whole run's stdout, stderr and every file under --results hold no credential, while
  headers with common words (`kvbench`, `rest`) leave kvbench's own data as it was.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from support import everything_under, kvbench, kvbench_at, one_line_error

from kvbench import records
from kvbench.harness.quality import agreement, fidelity, logprobs
from kvbench.testing.fakeserver import FakeConfig, FakeServer

TASK = "kvbench_passkey_512"
KEY = "sk-round4-5f0c7e91ab"
ORG = "org-round4-2d9e"


@pytest.fixture(scope="module")
def tok(trained_model):
    from kvbench.core.tokenizer import load_tokenizer

    return load_tokenizer(trained_model)


def measure(tok, fp8: FakeConfig, auto: FakeConfig | None = None, k: int = 5):
    """auto (honest unless given), then fp8, through one Fidelity: (fp8's summary, the problems by dtype)."""
    fid = fidelity.Fidelity(tok, [TASK], per_task=3, k=k)
    with FakeServer(auto or FakeConfig()) as a, FakeServer(fp8) as b:
        try:
            asyncio.run(fid.measure(a.base_url, "kvbench-fake", "auto", 2))
        except Exception as exc:  # auto's own failure: what phases.measure_fidelity records as a warning
            fid.problems.setdefault("auto", []).append(str(exc))
        try:
            out = asyncio.run(fid.measure(b.base_url, "kvbench-fake", "fp8", 2))
        except Exception as exc:
            out = {"raised": str(exc)}
    return out, fid.problems


# damage -> what the refusal says (fp8's server lies in both conditions: neither is measured)
LIES = {
    "nan": "logprob +nan",
    "inf": "logprob +inf",
    "neginf": "logprob -inf",
    "positive": "logprob +3",
    "dup": "twice in one object",
    "dup0": ("is not a plain integer", "lists 7 tokens for top-5"),  # the first rule it breaks
    "massgt1": "sum to",
    "fewk": "fewer than the 5 asked",
    "strlp": "not a number (got str)",
    "nonint": "token id 'tok",
    "nokey": "not a number (got null)",
    "huge": ("larger than", "tokens for top-5"),  # a body past its bound is not even parsed
    "listpos": "is list, not",
    "null": "prompt_logprobs is null",
    "short": "positions for a",
    "long": "positions for a",
    "zero_rows": "has 0 positions",
    "choices_empty": "no choices",
}


@pytest.mark.parametrize("damage", list(LIES))
def test_a_candidates_lying_logprobs_are_refused_with_the_position(tok, damage):
    out, problems = measure(tok, FakeConfig(damage=damage, damage_only="fidelity"))
    assert out == {}, out  # no KLD of 0 ("no measurable change") or of millions of nats from a lie
    said = problems["fp8"]
    assert [p.split(" not measured")[0] for p in said] == ["fidelity rest", "fidelity load"], said
    reasons = LIES[damage] if isinstance(LIES[damage], tuple) else (LIES[damage],)
    assert all(any(r in p for r in reasons) and "\n" not in p for p in said), said
    assert "auto" not in problems


@pytest.mark.parametrize("damage", ["nan", "positive"])
def test_the_references_lying_logprobs_leave_no_fidelity_and_say_why(tok, damage):
    out, problems = measure(tok, FakeConfig(), auto=FakeConfig(damage=damage, damage_only="fidelity"))
    assert "no reference: auto at rest" in out["raised"] and LIES[damage] in out["raised"]
    assert problems["auto"] == [p for p in problems["auto"] if "fidelity rest not measured" in p]


@pytest.mark.parametrize(
    "damage,said", [("bigcont", "tokens for max_tokens"), ("nocont", "has no token_ids (got null)")]
)
def test_autos_continuation_is_bounded_by_max_tokens(tok, damage, said):
    out, problems = measure(tok, FakeConfig(), auto=FakeConfig(damage=damage))
    assert said in out["raised"] and "no reference: auto's answers" in out["raised"]


def test_one_conditions_bad_answers_leave_the_other_measured(tok, monkeypatch):
    fid = fidelity.Fidelity(tok, [TASK], per_task=3, k=5)
    original = fidelity.score_items

    async def lying_at_load(session, base_url, model, items, concurrency, k, least=None):
        if concurrency > 1:
            raise logprobs.BadAnswer("prompt_logprobs position 9, token 5: logprob +nan")
        return await original(session, base_url, model, items, concurrency, k, least)

    with FakeServer(FakeConfig()) as a, FakeServer(FakeConfig()) as b:
        asyncio.run(fid.measure(a.base_url, "kvbench-fake", "auto", 1))
        monkeypatch.setattr(fidelity, "score_items", lying_at_load)
        out = asyncio.run(fid.measure(b.base_url, "kvbench-fake", "fp8", 2))
    assert set(out) == {"rest"} and out["rest"]["mean_kld"] == 0.0
    said = "fidelity load not measured: BadAnswer: prompt_logprobs position 9, token 5: logprob +nan"
    assert fid.problems["fp8"] == [said]


def test_a_body_past_what_the_request_needs_is_not_read(tok, monkeypatch):
    monkeypatch.setattr(logprobs, "BASE_BYTES", 1000)
    monkeypatch.setattr(logprobs, "ENTRY_BYTES", 4)
    out, problems = measure(tok, FakeConfig())
    assert "larger than" in problems["auto"][0] and "MiB" in problems["auto"][0]


def test_kl_of_inputs_that_are_not_distributions_is_nan_not_zero():
    from kvbench.core import fidelity_stats as fs

    assert fs.kl_topk({1: float("nan")}, {1: -0.1}) != fs.kl_topk({1: float("nan")}, {1: -0.1})  # NaN
    # a candidate side of mass 1.8: the "KL" is negative, impossible for two distributions
    half, most = math.log(0.5), math.log(0.9)
    kl = fs.kl_topk({1: half, 2: half}, {1: most, 2: most})
    assert kl != kl
    s = fs.summarize([{"kld": [0.5, float("nan")], "agree": [True, True], "dlogp": [0.0, 0.0]}], "t")
    assert s["tokens"] == 1 and s["dropped_positions"] == 1 and s["mean_kld"] == 0.5


# -- K-B19: the agreement's teacher-forced request -------------------------------------------------------


@pytest.mark.parametrize("damage", ["null", "short", "zero_rows", "choices_empty", "listpos", "nan", "dup"])
def test_an_agreement_answer_of_the_wrong_shape_is_a_value_error(damage):
    prompts = [[5, 9, 11, 13], [7, 8, 9, 10]]
    with FakeServer(FakeConfig()) as a, FakeServer(FakeConfig(damage=damage, damage_only="agreement")) as b:
        ref = asyncio.run(agreement.collect(a.base_url, "kvbench-fake", prompts, 4, None))
        samples = [agreement.Sample(**s) for s in ref["samples"]]
        with pytest.raises(ValueError) as exc:  # phases.agreement records it; never TypeError or IndexError
            asyncio.run(agreement.collect(b.base_url, "kvbench-fake", prompts, 4, samples))
    assert isinstance(exc.value, logprobs.BadAnswer) and "\n" not in str(exc.value)


def run_pair(tmp_path, model, auto: dict, fp8: dict, *args, env=None):
    """`kvbench run` of auto and fp8 on their own fake servers (FakeConfig fields `auto` and `fp8` on top of
    a pair that answers the pass-key task), with eval and fidelity, at one small load."""
    common = dict(answers="passkey", max_model_len=512, ttft_s=0.002, itl_s=0.0005, vllm_version="0.32.0")
    with (
        FakeServer(FakeConfig(**{**common, "kv_cache_dtype": "auto", **auto})) as a,
        FakeServer(FakeConfig(**{**common, "kv_cache_dtype": "fp8", "num_gpu_blocks": 2048, **fp8})) as b,
    ):
        out = kvbench_at(
            "run",
            f"auto={a.base_url},fp8={b.base_url}",
            model,
            tmp_path,
            "--no-search",
            "--no-sweep",
            "--repeat",
            "1",
            "--concurrency",
            "4",
            "--num-requests",
            "12",
            "--eval-tasks",
            TASK,
            "--eval-limit",
            "6",
            *args,
            json_out=False,
            env=env,
        )
    return out


def test_a_null_prompt_logprobs_fails_neither_the_dtype_nor_the_run(tmp_path, trained_model):
    """K-B19 (fid_null): fp8 answers prompt_logprobs null to the agreement and the fidelity requests: its load
    phases and eval are measured, the agreement says why it has no comparison, fidelity is a warning."""
    out = run_pair(tmp_path, trained_model, {}, {"damage": "null"})
    assert out.returncode == 0, out.stderr[-3000:]
    doc = records.load_record(records.find_records(tmp_path)[0])
    fp8 = next(d for d in doc["dtypes"] if d["kv_cache_dtype"] == "fp8")
    assert fp8["status"] == "ok" and fp8["phases"] and fp8["eval"]["rest"]["tasks"][TASK]["n"] == 6
    assert "prompt_logprobs is null" in fp8["agreement"]["error"]
    assert fp8["fidelity"] is None and any("prompt_logprobs is null" in w for w in fp8["warnings"])


def test_no_credential_in_anything_a_run_prints_or_writes(tmp_path, trained_model):
    """K-B20 (sec_echo_text_500), N-P8 (np8_secret_b64), K-B16 (b_kb16_hdr_kvbench, kb16_hdr_rest): fidelity
    requests answered 500 with the request's headers, the agreement's with base64 of `Authorization` (load
    requests' 500s: test_endpoint_hostile.py); beside them, routing headers with common words. Nothing printed
    or written holds the key or the org header; the schema, the dtypes and `rest` stay kvbench's own."""
    echo = dict(damage="echo500", damage_only="fidelity", api_key=KEY)
    b64 = dict(damage="b64echo500", damage_only="agreement", api_key=KEY)
    headers = ["--header", f"X-Org: {ORG}", "--header", "X-Client: kvbench", "--header", "X-Tier: rest"]
    headers += ["--header", "X-Model: kvbench-fake"]  # a gateway's routing header naming the served model
    out = run_pair(tmp_path, trained_model, b64, echo, *headers, "--api-key", KEY)
    assert out.returncode == 0, out.stderr[-3000:]
    path = records.find_records(tmp_path)[0]
    raw = json.loads(Path(path).read_text())
    assert raw["schema"] == "kvbench.run/2" and [d["kv_cache_dtype"] for d in raw["dtypes"]] == ["auto", "fp8"]
    assert raw["config"]["model_name"] == "kvbench-fake" == raw["dtypes"][0]["server"]["served_model"]
    assert "rest" in raw["dtypes"][1]["eval"] and "HTTP 500" in " ".join(raw["dtypes"][1]["warnings"])
    fid = records.samples_frame([path], "fidelity")
    assert set(fid.condition) == {"load"}  # auto's floor, under its own name
    report = kvbench("report", str(path))
    site = kvbench("dashboard", "--results", str(tmp_path), "--out", str(tmp_path / "site"))
    assert report.returncode == 0 and site.returncode == 0, report.stderr + site.stderr
    written = everything_under(tmp_path)
    shown = out.stdout + out.stderr + report.stdout + report.stderr + site.stdout + site.stderr
    for secret in (KEY, ORG):
        assert secret not in written and secret not in shown
    import base64

    for secret in (KEY, f"Bearer {KEY}"):
        assert base64.b64encode(secret.encode()).decode()[4:16] not in written + shown


@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", "auto"],
        ["--api-key", "kvbench"],
        ["--header", "X-Api-Key: rest"],
        ["--header", "Authorization: Bearer password"],
    ],
)
def test_a_credential_that_cannot_be_scrubbed_is_refused_before_anything_runs(tmp_path, args):
    out = kvbench("run", "--endpoint", "http://127.0.0.1:9", *args, "--results", str(tmp_path / "r"))
    line = one_line_error(out)
    assert "cannot be scrubbed safely" in line and not (tmp_path / "r").exists()
    value = args[-1].split()[-1].split(":")[-1].strip()
    assert value not in line.removeprefix("kvbench: error: ").replace("--api-key", "")  # never echoed
