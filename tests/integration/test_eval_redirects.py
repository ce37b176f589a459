"""lm-eval's requests carry the user's key and headers (issue 36): they follow no redirect, on either of lm-eval's
paths (one request in flight: requests; several: aiohttp), and a server that only watches (the catcher) sees
nothing of them. Tested through `evaluate`, which both `kvbench eval --endpoint` and a run's eval phase use,
and through `kvbench eval --endpoint` against a server that starts redirecting once its checks passed."""

from __future__ import annotations

import pytest
from support import kvbench_at

from kvbench.core.errors import KvbenchError
from kvbench.testing.fakeserver import FakeConfig, FakeServer

KEY = "sk-kvbench-eval-0123456789"
TEAM = "hush-hush-36"
HEADERS = {"Authorization": f"Bearer {KEY}", "X-Secret-Team": TEAM}
TASK = "kvbench_passkey_512"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from kvbench.tinymodel.build import build_tokenizer

    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(path)
    return path


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def catcher():
    """A header-capturing server that only watches: what reaches it is what a redirect carried away."""
    with FakeServer(FakeConfig(answers="passkey")) as srv:
        yield srv


@pytest.mark.parametrize("concurrent", [1, 3])
def test_lm_eval_follows_no_redirect(tok_dir, catcher, concurrent):
    from kvbench.harness.quality.evaluation import evaluate

    for target in (catcher.base_url, catcher.base_url.replace("http://", "https://")):
        with FakeServer(FakeConfig(redirect_to=target)) as mover:
            with pytest.raises(KvbenchError) as exc:
                evaluate(mover.base_url, "kvbench-fake", tok_dir, [TASK], num_concurrent=concurrent, limit=2,
                         headers=HEADERS)  # fmt: skip
            text = str(exc.value)
            assert "redirect" in text and "\n" not in text and KEY not in text and TEAM not in text, text
            paths = [h["path"] for h in mover.headers_seen()]  # refused at the first answers (2 items in flight)
            assert set(paths) == {"/v1/completions"} and len(paths) <= 2, paths
    assert catcher.headers_seen() == []


@pytest.mark.parametrize("concurrent", [1, 3])
def test_lm_eval_still_sends_the_credential_to_the_named_server(tok_dir, concurrent):
    from kvbench.harness.quality.evaluation import evaluate

    with FakeServer(FakeConfig(answers="passkey", api_key=KEY)) as srv:
        res = evaluate(srv.base_url, "kvbench-fake", tok_dir, [TASK], num_concurrent=concurrent, limit=3,
                       headers=HEADERS)  # fmt: skip
        seen = srv.headers_seen()
    assert res.tasks[TASK].value == 1.0
    posts = [h for h in seen if h["path"] == "/v1/completions"]
    assert len(posts) == 3 and all(h["Authorization"] == f"Bearer {KEY}" and h["X-Secret-Team"] == TEAM for h in posts)


def test_kvbench_eval_endpoint_refuses_a_redirect_after_its_checks(tok_dir, catcher, tmp_path, monkeypatch):
    """The metadata checks pass; the completions lm-eval then sends are redirected (a server that moves)."""
    from kvbench.harness.quality import evaluation

    real = evaluation.evaluate
    with FakeServer(FakeConfig(answers="passkey", api_key=KEY)) as srv:

        def moving(*args, **kwargs):
            srv.configure(redirect_to=catcher.base_url)  # the server moves once kvbench's checks are done
            return real(*args, **kwargs)

        monkeypatch.setattr(evaluation, "evaluate", moving)
        out = kvbench_at("eval", srv.base_url, tok_dir, tmp_path, "--tasks", TASK, "--limit", "2",
                         "--header", f"X-Secret-Team: {TEAM}", env={"OPENAI_API_KEY": KEY})  # fmt: skip
    assert out.returncode != 0 and "redirect" in out.stderr, out.stderr[-2000:]
    assert catcher.headers_seen() == []
    assert KEY not in out.stdout + out.stderr and TEAM not in out.stdout + out.stderr
