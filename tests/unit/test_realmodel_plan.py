"""A real model's run plan and its natural-text material (harness/run/realplan.py, kvbench/realmodels/texttasks.py,
harness/quality/textfidelity.py), with the tiny model's tokenizer standing in for a real one: no conversion, no
server."""

from __future__ import annotations

import pytest

from kvbench.core.datafiles import load_toml
from kvbench.harness.quality.textfidelity import text_items
from kvbench.harness.run import realplan
from kvbench.realmodels import text, texttasks
from kvbench.specs import evaltasks


@pytest.fixture(scope="module")
def tok():
    from kvbench.core.tokenizer import load_tokenizer
    from kvbench.tinymodel.build import committed_dir

    return load_tokenizer(committed_dir())


def test_text_tasks_share_one_haystack_per_group_and_hide_the_answer(tok):
    items = evaltasks.generate("kvbench_textkeys_2048", tok, 20)
    keys = texttasks.SPEC["textkeys"]["keys"]
    assert [it.context for it in items] == [1024] * keys + [2048] * (20 - keys)
    first = items[:keys]
    head = first[0].prompt[: first[0].prompt.index("\n\nQuestion:")]
    assert all(it.prompt.startswith(head) for it in first)  # one prefix a server caches once
    assert len({it.answer for it in first}) == keys  # each key asked once
    for it in items:
        assert it.answer.isdigit() and len(it.answer) == texttasks.SPEC["code_digits"]
        assert f" is {it.answer}." in it.prompt
        assert it.prompt_tokens <= it.context - evaltasks.ANSWER_ROOM
    again = evaltasks.generate("kvbench_textkeys_2048", tok, 20)
    assert [it.prompt for it in again] == [it.prompt for it in items]  # deterministic


def test_text_task_names_are_known_with_their_contexts():
    assert evaltasks.parse_task("kvbench_textkey_8192") == ("textkey", 8192)
    assert "kvbench_textkeys_1024" in evaltasks.task_names()
    with pytest.raises(Exception, match="kvbench_textkey_1024"):
        evaltasks.parse_task("kvbench_textkey_512")


def test_fidelity_windows_are_natural_text_scored_after_the_prefix(tok):
    items = text_items(tok, windows=5, prefix=64, scored=96)
    assert len(items) == 5 and all(it["teacher_forced"] for it in items)
    assert all(len(it["cont_ids"]) == 96 and it["cont_ids"] == it["gold_ids"] for it in items)
    corpus_ids = tok.encode(text.corpus(), add_special_tokens=False)
    bos = items[0]["prompt_ids"][: len(items[0]["prompt_ids"]) - 64]
    assert bos == tok.encode("a")[:1]  # the tiny tokenizer prepends <s>: so does every window
    starts = [corpus_ids.index(it["prompt_ids"][len(bos)]) for it in items[:1]]
    assert starts == [0]
    assert len({tuple(it["cont_ids"]) for it in items}) == 5  # windows never repeat


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_each_real_model_plans_at_least_20000_positions_per_condition(name):
    plan = load_toml(realplan.RUNS)[name]
    fid = plan["text_fidelity"]
    assert fid["windows"] * fid["scored"] >= 20_000
    assert set(plan["eval_conditions"]) <= set(evaltasks_conditions())
    for task in plan["eval_tasks"]:
        assert evaltasks.parse_task(task)[1] <= plan["max_model_len"]


def evaltasks_conditions():
    from kvbench.records.schema import CONDITIONS

    return CONDITIONS


def test_the_slo_scales_with_the_model_and_the_cores():
    small, how = realplan.derived_slo(0.1345, 2, 512)
    assert small == {"ttft_p95_ms": 2970.0, "tpot_p95_ms": 102.0}
    assert "0.135 B parameters on 2 cores" in how
    big, _ = realplan.derived_slo(0.269, 2, 512)
    fast, _ = realplan.derived_slo(0.1345, 8, 512)
    assert big["tpot_p95_ms"] == pytest.approx(2 * small["tpot_p95_ms"], rel=0.01)
    assert fast["ttft_p95_ms"] == pytest.approx(small["ttft_p95_ms"] / 4, rel=0.01)


def test_a_model_that_is_not_in_the_registry_plans_as_before():
    from kvbench.harness.run.settings import RunSettings

    s = RunSettings.for_machine(False, model="/some/folder")
    real = realplan.for_settings(s)
    assert real.name is None and real.settings is s
    marker = object()
    assert real.finish(marker) is marker
