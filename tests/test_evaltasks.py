"""kvbench's own retrieval tasks: deterministic, exact, within their token budgets, loadable by lm-eval."""

from __future__ import annotations

import json
import re

import pytest

from kvbench import evaltasks
from kvbench.errors import UsageError


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from kvbench.harness.tinymodel import build_tokenizer

    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tok_dir))


def test_digits_are_single_tokens(tok):
    ids = tok.encode(" 47192", add_special_tokens=False)
    assert [tok.decode([i]) for i in ids] == [" ", "4", "7", "1", "9", "2"]
    assert tok.encode("x")[0] == tok.bos_token_id  # the server adds a BOS, as training did


@pytest.mark.parametrize("task", ["kvbench_passkey_512", "kvbench_multikey_1024"])
def test_items_are_deterministic_exact_and_fit(tok, task):
    a = evaltasks.generate(task, tok, 12)
    b = evaltasks.generate(task, tok, 12)
    assert a == b
    kind, ctx = evaltasks.parse_task(task)
    budget = ctx - evaltasks.ANSWER_ROOM
    for item in a:
        assert re.fullmatch(r"\d{5}", item.answer)
        n = len(tok.encode(item.prompt, add_special_tokens=False))
        assert n == item.prompt_tokens and budget - 40 <= n <= budget  # filled to the budget, never over
        if kind == "passkey":
            assert f"The pass key is {item.answer}." in item.prompt
            assert item.prompt.endswith("The pass key is")
        else:
            name = re.search(r"The pass key of (\S+) is$", item.prompt).group(1)
            assert f"The pass key of {name} is {item.answer}." in item.prompt
            assert len(re.findall(r"The pass key of \S+ is \d+\.", item.prompt)) == evaltasks.MULTIKEY_KEYS
    assert [i.depth for i in a[:5]] == list(evaltasks.DEPTHS)
    other = evaltasks.generate(task, tok, 12, seed=evaltasks.SEED + 1)
    assert [i.answer for i in other] != [i.answer for i in a]


def test_needle_depth_is_where_it_says(tok):
    items = evaltasks.generate("kvbench_passkey_1024", tok, 5)
    where = [i.prompt.index("The pass key is ") / len(i.prompt) for i in items]
    assert where == sorted(where) and where[0] < 0.15 and where[-1] > 0.85


def test_score_is_exact():
    assert evaltasks.score(" 47192.", "47192") == 1
    assert evaltasks.score(" 47192\nmore", "47192") == 1
    assert evaltasks.score(" 4719", "47192") == 0
    assert evaltasks.score(" 471920", "47192") == 0


def test_bad_task_names_are_one_line():
    with pytest.raises(UsageError, match="choose from: kvbench_multikey_1024"):
        evaltasks.parse_task("kvbench_passkey_100")
    with pytest.raises(UsageError):
        evaltasks.parse_task("kvbench_needle_512")


def test_written_tasks_load_in_lm_eval(tok_dir, tmp_path):
    from lm_eval.tasks import TaskManager

    folder = evaltasks.write_tasks(tok_dir, ["kvbench_passkey_512"], n=6, root=tmp_path)
    assert folder == evaltasks.write_tasks(tok_dir, ["kvbench_passkey_512"], n=6, root=tmp_path)  # reused
    rows = [json.loads(line) for line in (folder / "kvbench_passkey_512.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and rows[0]["doc_id"] == 0
    tm = TaskManager(include_path=str(folder))
    task = tm.load(["kvbench_passkey_512"])["tasks"]["kvbench_passkey_512"]
    docs = list(task.test_docs())
    assert task.doc_to_text(docs[0]) == rows[0]["prompt"] and task.doc_to_target(docs[0]) == rows[0]["answer"]
    assert task.config.generation_kwargs["until"] == ["\n", "."]
