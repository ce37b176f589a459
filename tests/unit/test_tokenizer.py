"""kvbench.core.tokenizer loads a folder that names TokenizersBackend without AutoTokenizer's imports: it must be the
tokenizer AutoTokenizer (what vLLM and lm-eval load) gives, or prompt lengths and task items would drift."""

from __future__ import annotations

import json
import shutil

import pytest

from kvbench.core.tokenizer import load_tokenizer, tokenizer_class

TEXTS = ["hello world", "The pass key is 40291. Remember it.\n\nWhat is the pass key?", "  spaces\tand\nlines  ", ""]


def _same(a, b) -> None:
    assert type(a) is type(b)
    for text in TEXTS:
        assert a(text)["input_ids"] == b(text)["input_ids"], text
        assert a(text, add_special_tokens=False)["input_ids"] == b(text, add_special_tokens=False)["input_ids"]
    assert a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids
    assert (a.bos_token_id, a.eos_token_id, a.model_max_length) == (b.bos_token_id, b.eos_token_id, b.model_max_length)
    chat = [{"role": "user", "content": TEXTS[1]}]
    if a.chat_template or b.chat_template:
        assert a.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == b.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=False
        )


@pytest.mark.parametrize("which", ["tiny_model", "trained_model"])
def test_the_direct_path_gives_what_autotokenizer_gives(which, request):
    from transformers import AutoTokenizer

    path = request.getfixturevalue(which)
    assert tokenizer_class(path) == "TokenizersBackend"  # the direct path is the one taken
    _same(load_tokenizer(path), AutoTokenizer.from_pretrained(str(path), local_files_only=True))


def test_a_folder_naming_another_class_goes_through_autotokenizer(tmp_path, trained_model):
    from transformers import AutoTokenizer

    folder = tmp_path / "tok"
    shutil.copytree(trained_model, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_class": "PreTrainedTokenizerFast"}))
    _same(load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder), local_files_only=True))


@pytest.mark.parametrize("content", [None, "not json", "[1, 2]", '{"tokenizer_class": 3}'])
def test_no_usable_class_name_is_none(tmp_path, content):
    if content is not None:
        (tmp_path / "tokenizer_config.json").write_text(content)
    assert tokenizer_class(tmp_path) is None
