"""The CPU default's trained tiny model: built once (a few minutes) and cached; these tests reuse the cache."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_trained_model_report_and_determinism(trained_model):
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from kvbench.harness import tinymodel, tinytrain

    report = json.loads((trained_model / "training_report.json").read_text())
    assert report["fingerprint"] == tinytrain.fingerprint() and report["config"] == tinymodel.CONFIG
    assert report["steps"] == tinytrain.RECIPE["steps"] and len(report["loss_curve"]) == report["steps"] // 10
    assert report["wall_time_s"]["total"] > 0 and report["versions"]["torch"] == torch.__version__
    default = next(e for e in report["accuracy_fp32"] if e["task"] == "kvbench_passkey_512")
    assert default["exact_match"] >= 0.9 and default["n"] >= 100
    # The loss curve is reproducible: the first 20 steps again give the same numbers.
    tok = AutoTokenizer.from_pretrained(str(trained_model))
    threads = torch.get_num_threads()
    torch.set_num_threads(tinytrain.RECIPE["threads"])
    try:
        torch.manual_seed(tinymodel.SEED)
        model = LlamaForCausalLM(tinymodel.llama_config(len(tok))).float()
        curve = tinytrain.train(model, tok, stop_after=20)
    finally:
        torch.set_num_threads(threads)
    assert curve == report["loss_curve"][:2]


def test_random_and_trained_builds_are_apart(tmp_path):
    from kvbench.harness import tinymodel

    assert tinymodel.model_dir(tmp_path) != tinymodel.trained_dir(tmp_path)
    assert tinymodel.trained_dir(tmp_path).parent == tinymodel.model_dir(tmp_path).parent  # beside each other


def test_random_build_is_atomic_and_cached(tmp_path):
    from kvbench.harness import tinymodel

    path = tinymodel.ensure_tiny_model(tmp_path)
    assert (path / "BUILD_OK").read_text().strip() == tinymodel.fingerprint()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert tinymodel.ensure_tiny_model(tmp_path) == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left behind


def test_previous_token_prior_attends_one_and_two_back(tmp_path):
    import torch
    from transformers import LlamaForCausalLM

    from kvbench.harness import tinymodel, tinytrain

    tok = tinymodel.build_tokenizer(tmp_path)
    torch.manual_seed(0)
    model = LlamaForCausalLM(tinymodel.llama_config(len(tok))).float()
    model.config._attn_implementation = "eager"  # attention weights are returned only by the eager path
    tinytrain.previous_token_prior(model)
    ids = torch.randint(3, len(tok), (1, 1500))
    with torch.no_grad():
        att = model(input_ids=ids, output_attentions=True).attentions[0][0]
    rows = torch.arange(2, ids.shape[1])
    assert att[0, rows, rows - 1].mean() > 0.9 and att[1, rows, rows - 2].mean() > 0.9
    assert att[2, rows, rows - 1].mean() < 0.5  # the other KV head's query heads are left to training
