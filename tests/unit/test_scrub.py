"""kvbench/core/scrub.py (issue 42, K-B16, N-P8): credentials are removed as whole tokens, in their plain, escaped
and base64 forms, from text that came from outside; kvbench's own fields and dict keys are never touched; a
credential too short or too word-like to scrub safely is refused up front, never echoed."""

from __future__ import annotations

import base64
import io
import json
import sys

import pytest

from kvbench.core import scrub
from kvbench.core.errors import UsageError

KEY = "sk-trust-7f3a9c21d0"
ORG = "org-value-4b8e12"


@pytest.fixture(autouse=True)
def remembered():
    scrub.remember_headers({"Authorization": f"Bearer {KEY}", "X-Org": ORG, "X-Tier": "rest", "X-Client": "kvbench"})


def test_a_credential_is_removed_as_a_whole_token_in_every_form():
    text = f"key {KEY}, org={ORG}; json {json.dumps({'h': ORG})}"
    assert KEY not in scrub.scrub_text(text) and ORG not in scrub.scrub_text(text)
    # whole tokens only: the same characters inside a longer word are another word
    assert scrub.scrub_text(f"x{ORG}y") == f"x{ORG}y"
    # base64 of the key at each of the three byte alignments inside a longer base64 text (N-P8)
    for prefix in ("", "a", "ab", "Bearer ", "Authorization: Bearer "):
        blob = base64.b64encode(f"{prefix}{KEY} trailing".encode()).decode()
        assert scrub.scrub_text(blob) != blob, prefix
        assert base64.b64encode(KEY.encode()).decode()[:8] not in scrub.scrub_text(f"z {blob}")
    urlsafe = base64.urlsafe_b64encode(f"??>{KEY}".encode()).decode()
    assert scrub.scrub_text(urlsafe) != urlsafe


@pytest.mark.parametrize("word", ["kvbench", "rest", "auto", "tiny-llama", "fp8", "load"])
def test_common_header_values_never_rename_kvbenchs_own_data(word):
    scrub.remember_headers({"X-Client": word})
    doc = {
        "schema": "kvbench.run/2",
        "dtypes": [{"kv_cache_dtype": "auto", "eval": {"rest": {"tasks": {}}}, "error": f"{word} said no"}],
        "rest": {"condition": "rest"},
        "server": {"served_model": word},
    }
    out = scrub.scrub_doc(doc)
    assert out["schema"] == "kvbench.run/2" and out["dtypes"][0]["kv_cache_dtype"] == "auto"
    assert "rest" in out["dtypes"][0]["eval"] and out["rest"]["condition"] == "rest"  # keys and owned fields
    assert out["server"]["served_model"] == word  # the server's name, as kvbench sends it back
    if scrub.unscrubbable(word):  # too common to be remembered: not a secret, and left as it is
        assert out["dtypes"][0]["error"] == f"{word} said no"
    else:  # a header value that can be scrubbed is, from what the server said, and only there
        assert out["dtypes"][0]["error"] == "REDACTED said no"


@pytest.mark.parametrize("value", ["auto", "kvbench", "rest", "password", "letmein", "short1"])
@pytest.mark.parametrize("how", ["api-key", "x-api-key", "cookie"])
def test_a_credential_too_short_or_common_is_refused_without_echo(value, how):
    headers = {
        "api-key": {"Authorization": f"Bearer {value}"},
        "x-api-key": {"X-Api-Key": value},
        "cookie": {"Cookie": value},
    }[how]
    with pytest.raises(UsageError) as exc:
        scrub.check_credentials(headers)
    text = str(exc.value)
    assert "scrubbed safely" in text and "\n" not in text and f" {value} " not in f" {text} "
    assert ("--api-key" in text) == (how == "api-key")


def test_a_routing_header_with_a_common_value_is_sent_and_not_a_credential():
    scrub.check_credentials({"X-Tier": "rest", "X-Model": "tiny-llama", "Authorization": f"Bearer {KEY}"})


def test_tables_keep_kvbenchs_columns_and_scrub_the_servers():
    import pyarrow as pa

    table = pa.table({"kv_cache_dtype": ["auto"], "condition": ["rest"], "response": [f"echo {KEY}"]})
    out = scrub.scrub_table(table).to_pylist()[0]
    assert out == {"kv_cache_dtype": "auto", "condition": "rest", "response": "echo REDACTED"}


def test_what_the_cli_prints_is_scrubbed(monkeypatch):
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    with scrub.printing_scrubbed():
        print(f'"Authorization": "Bearer {KEY}", "X-Org": "{ORG}" rest kvbench')
        sys.stderr.write(f"{ORG}\n")
    assert KEY not in out.getvalue() and ORG not in out.getvalue() + err.getvalue()
    assert "rest kvbench" in out.getvalue() and sys.stdout is out
