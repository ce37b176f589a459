"""The endpoint-only options (--api-key, OPENAI_API_KEY, --header) mean the same in `kvbench run` and
`kvbench eval`: one check (harness/server/endpoint.py request_headers) and one treatment of the shell's key."""

from __future__ import annotations

import pytest

from kvbench.core.errors import UsageError
from kvbench.harness.server.endpoint import request_headers
from tests.support import cli

KEY = "sk-0123456789abcdef"  # long and random enough to scrub


def test_the_headers_carry_the_key_unless_a_header_sets_authorization():
    assert request_headers({"X-Team": "serving"}, KEY, True) == {"X-Team": "serving", "Authorization": f"Bearer {KEY}"}
    assert request_headers({"Authorization": f"Bearer {KEY}x"}, KEY, True) == {"Authorization": f"Bearer {KEY}x"}
    assert request_headers(None, None, False) == {}


@pytest.mark.parametrize(("headers", "key"), [({"X-Team": "serving"}, None), (None, KEY)])
def test_a_key_or_header_without_endpoint_is_refused(headers, key):
    with pytest.raises(UsageError, match="--api-key/--header are for --endpoint servers"):
        request_headers(headers, key, False)


def test_an_unscrubbable_key_is_refused_without_echoing_it():
    with pytest.raises(UsageError, match="cannot be scrubbed") as exc:
        request_headers(None, "kvbench", True)
    assert "Bearer kvbench" not in str(exc.value)


@pytest.mark.parametrize("command", ["run", "eval"])
@pytest.mark.parametrize("flag", [["--api-key", KEY], ["--header", "X-Team: serving"]])
def test_run_and_eval_refuse_endpoint_options_without_endpoint_alike(capsys, tmp_path, command, flag):
    status, _, err = cli(capsys, command, *flag, "--results", tmp_path)
    assert status == 2 and err.strip().splitlines() == [
        "kvbench: error: --api-key/--header are for --endpoint servers; kvbench's own servers need none"
    ], err


@pytest.mark.parametrize(("command", "bad"), [("run", ["--num-requests", "0"]), ("eval", ["--limit", "0"])])
def test_the_shells_key_is_noted_and_ignored_by_run_and_eval_without_endpoint(capsys, monkeypatch, command, bad):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    status, _, err = cli(capsys, command, *bad)
    note, line = err.strip().splitlines()
    assert status == 2 and "must be a whole number >= 1" in line  # the next thing wrong is named, not the key
    assert "OPENAI_API_KEY is set and not used" in note and KEY not in err
