"""The installed vLLM's facts are asked in a child process that imports vLLM (~10 s); for kvbench's own
interpreter the answer is kept on disk and asked again only when what it depends on changes."""

from __future__ import annotations

import sys

import pytest

from kvbench.harness.server import vllm_info


@pytest.fixture
def probes(monkeypatch, tmp_path):
    if vllm_info._facts_key(sys.executable) is None:
        pytest.skip("vLLM is not installed: nothing is cached without it")
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    calls = []

    def probe(python):
        calls.append(python)
        return {"version": "9.9.9", "accepted": ["auto", "fp8"], "n": len(calls)}

    monkeypatch.setattr(vllm_info, "_probe", probe)

    def facts(python=sys.executable):
        vllm_info.vllm_facts.cache_clear()  # a new kvbench process
        return vllm_info.vllm_facts(python)

    yield facts, calls, tmp_path / "vllm-facts"
    vllm_info.vllm_facts.cache_clear()


def test_a_second_process_reads_the_answer_without_asking(probes):
    facts, calls, folder = probes
    assert facts() == facts() == {"version": "9.9.9", "accepted": ["auto", "fp8"], "n": 1}
    assert len(calls) == 1 and len(list(folder.glob("*.json"))) == 1


def test_a_changed_plugin_choice_asks_again(probes, monkeypatch):
    facts, calls, _ = probes
    facts()
    monkeypatch.setenv("VLLM_PLUGINS", "")  # vLLM then loads no plugin: its answer may differ
    assert facts()["n"] == 2 and len(calls) == 2


def test_a_damaged_entry_is_asked_again_and_rewritten(probes):
    facts, calls, folder = probes
    facts()
    (entry,) = folder.glob("*.json")
    entry.write_text('{"version": ')
    assert facts()["n"] == 2 and facts()["n"] == 2  # rewritten whole, then read
    assert len(calls) == 2


def test_another_interpreter_is_asked_every_time(probes, tmp_path):
    facts, calls, folder = probes
    other = str(tmp_path / "other-venv" / "python")
    facts(other)
    facts(other)
    assert calls == [other, other] and not folder.exists()
