"""kvbench's own retrieval tasks: deterministic, exact, within their token budgets, loadable by lm-eval."""

from __future__ import annotations

import json
import re

import pytest

from kvbench.core.errors import UsageError
from kvbench.specs import evaltasks


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from kvbench.tinymodel.build import build_tokenizer

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
    with pytest.raises(UsageError, match="choose from: kvbench_manykeys_1024, .*kvbench_track_512"):
        evaltasks.parse_task("kvbench_passkey_100")
    with pytest.raises(UsageError):
        evaltasks.parse_task("kvbench_haystack_512")


def test_written_tasks_load_in_lm_eval(tok_dir, tmp_path):
    from lm_eval.tasks import TaskManager

    folder = evaltasks.write_tasks(tok_dir, ["kvbench_passkey_512"], n=6, root=tmp_path)
    assert folder == evaltasks.write_tasks(tok_dir, ["kvbench_passkey_512"], n=6, root=tmp_path)  # reused
    rows = [json.loads(line) for line in (folder / "kvbench_passkey_512.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and rows[0]["doc_id"] == 0
    tm = TaskManager(include_path=str(folder), include_defaults=False)  # as kvbench loads its own tasks
    task = tm.load(["kvbench_passkey_512"])["tasks"]["kvbench_passkey_512"]
    docs = list(task.test_docs())
    assert task.doc_to_text(docs[0]) == rows[0]["prompt"] and task.doc_to_target(docs[0]) == rows[0]["answer"]
    assert task.config.generation_kwargs["until"] == ["\n", "."]


# -- the CPU default's quality tasks ----------------------------------------------------------------------


@pytest.mark.parametrize("task", ["kvbench_needle_512", "kvbench_manykeys_512", "kvbench_track_1024"])
def test_quality_tasks_are_deterministic_exact_and_fit(tok, task):
    a = evaltasks.generate(task, tok, 10)
    assert [i.doc() for i in a] == [i.doc() for i in evaltasks.generate(task, tok, 10)]
    kind, ctx = evaltasks.parse_task(task)
    budget = ctx - evaltasks.ANSWER_ROOM
    for item in a:
        n = len(tok.encode(item.prompt, add_special_tokens=False))
        assert n == item.prompt_tokens and budget - 40 <= n <= budget
        assert item.answer.isdigit() and item.answer[0] != "0"
    assert [i.depth for i in a[:5]] == list(evaltasks.DEPTHS)
    other = evaltasks.generate(task, tok, 10, seed=evaltasks.SEED + 1)
    assert [i.answer for i in other] != [i.answer for i in a]


def test_needle_is_one_long_key(tok):
    for item in evaltasks.generate("kvbench_needle_512", tok, 10):
        assert len(item.answer) == evaltasks.NEEDLE_DIGITS
        assert item.prompt.count(f"The pass key is {item.answer}.") == 1
        assert len(re.findall(r"\d+", item.prompt)) == 1 and item.prompt.endswith("The pass key is")


def test_manykeys_keys_follow_their_names(tok):
    for item in evaltasks.generate("kvbench_manykeys_512", tok, 10):
        pairs = re.findall(r"Key ([a-z]+)(\d+)\.", item.prompt)
        assert len(pairs) == evaltasks.MANYKEYS_KEYS and len({n for n, _ in pairs}) == evaltasks.MANYKEYS_KEYS
        asked = re.search(r"Key ([a-z]+)$", item.prompt).group(1)
        assert dict(pairs)[asked] == item.answer
        # the name's last token is the one right before the digits, in the needle as at the end of the question
        needle = tok.encode(f" Key {asked}{item.answer}.", add_special_tokens=False)
        question = tok.encode(f" Key {asked}", add_special_tokens=False)
        assert needle[: len(question)] == question and tok.decode(needle[len(question)]) == item.answer[0]
    assert evaltasks.continuation("manykeys", "12345") == "12345"  # the digits follow the name directly
    assert evaltasks.continuation("needle", "12345") == " 12345"


def test_track_answer_is_the_last_update_at_its_depth(tok):
    items = evaltasks.generate("kvbench_track_512", tok, 10)
    for item in items:
        values = re.findall(r"The box now holds (\d+)\.", item.prompt)
        assert len(values) == evaltasks.TRACK_UPDATES and len(set(values)) == len(values)
        assert values[-1] == item.answer
        for before, after in zip(values, values[1:], strict=False):  # look-alikes: each changes a few digits
            assert sum(a != b for a, b in zip(before, after, strict=True)) == evaltasks.TRACK_CHANGE
    # the last update sits where the depth says: at the start for depth 0, next to the question for depth 1
    where = [i.prompt.rindex("The box now holds ", 0, len(i.prompt) - 60) / len(i.prompt) for i in items[:5]]
    assert where == sorted(where) and where[0] < 0.4 and where[-1] > 0.85


def test_task_files_are_keyed_by_the_task_definition(tok_dir, tmp_path, monkeypatch):
    first = evaltasks.tasks_dir(tok_dir, root=tmp_path)
    monkeypatch.setattr(evaltasks, "NEEDLE_DIGITS", evaltasks.NEEDLE_DIGITS + 1)
    assert evaltasks.tasks_dir(tok_dir, root=tmp_path) != first  # other items: not the cached files


def test_lm_eval_task_names_are_indexed_once_per_install(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path))
    built = []
    monkeypatch.setattr(evaltasks, "_lm_eval_task_names", lambda: built.append(1) or ["gsm8k", "ruler"])
    evaltasks.check_task_names(["gsm8k"])
    evaltasks.check_task_names(["ruler", "kvbench_passkey_512"])  # read back, not indexed again
    with pytest.raises(UsageError, match="unknown lm-eval task 'gsm8kk'; did you mean gsm8k"):
        evaltasks.check_task_names(["gsm8kk"])
    assert built == [1] and len(list((tmp_path / "lm-eval-tasks").glob("*.json"))) == 1
