"""kernels/hf_nvfp4.divergence: the measure e2e's cross-check uses to tell a near tie from a different answer."""

from __future__ import annotations

from kvbench.kernels import hf_nvfp4
from kvbench.specs import evaltasks

TASK = "kvbench_needle_512"


def test_divergence_is_none_for_its_own_answer_and_large_for_a_wrong_one(trained_model):
    model, tok = hf_nvfp4.load(trained_model)
    item = evaltasks.generate(TASK, tok, 1)[0]
    max_toks = evaltasks.MAX_GEN_TOKS[evaltasks.parse_task(TASK)[0]]
    own = hf_nvfp4.greedy(model, tok, item.prompt, max_toks, evaltasks.STOP)
    stops = evaltasks.stop_token_ids(tok)
    assert own.strip() and hf_nvfp4.divergence(model, tok, item.prompt, own, max_toks, stops) is None
    # one digit off (what a cache returning wrong values gives) parts where the model is sure of the right one
    at = len(own) // 2
    wrong = own[:at] + str((int(own[at]) + 1) % 10) + own[at + 1 :]
    step, gap = hf_nvfp4.divergence(model, tok, item.prompt, wrong, max_toks, stops)
    assert step == len(tok(own[:at], add_special_tokens=False).input_ids) and gap > 3
    # stopping early parts at the end of the served text, against the best stop token
    step, gap = hf_nvfp4.divergence(model, tok, item.prompt, own[:at], max_toks, stops)
    assert step == len(tok(own[:at], add_special_tokens=False).input_ids) and gap > 3
