"""One scrubber for every string kvbench stores or shows that a server, a log or a user controls.

A server's error body may echo the request's headers (`Authorization: Bearer <key>`, a `--header` value);
such text reaches a request's `error`, a dtype's failure, a log tail, a canary's note. Every record
(JSON, through records.write_atomic) and every Parquet sample table passes its strings through `scrub_doc`
/ `scrub_table` before it is written, so nothing stored depends on each producer remembering to do it.

What is removed: every credential this process was given (`remember`: header values, API keys, the
password of a user:password@ URL; registered where an Endpoint is made), in its plain, JSON-escaped and
URL-quoted forms; and anything shaped like one (`Bearer ...`, `Basic ...`, `Authorization: ...`,
`api_key=...`, `sk-...`), whoever sent it. `excerpt` also makes a string one short line without control
characters (an escape sequence from a server never reaches a terminal or a page through it).
"""

from __future__ import annotations

import json
import re
import threading
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

REDACTED = "REDACTED"
EXCERPT_CHARS = 200  # what a stored error keeps of a server's body
MIN_SECRET_CHARS = 4  # shorter values would redact ordinary words; no real credential is that short

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern | None = None

# Credential-shaped text, whoever sent it: a scheme and its token, a header or a query key and its value.
_SHAPES = re.compile(
    r"(?P<lead>\b[Bb]earer\s+)[A-Za-z0-9._~+/=-]{8,}"
    # HTTP Basic: a base64 token, told from an English word by a digit, +, /, = or an inner capital
    r"|(?P<basic>\bBasic\s+)(?=[A-Za-z0-9+/]*(?:[0-9+/=]|[a-z][A-Z]))[A-Za-z0-9+/]{8,}={0,2}"
    r"|(?P<key>(?i:\b(?:authorization|proxy-authorization|x-api-key|api[-_]?key|access[-_]token|set-cookie|cookie|"
    r"password))[\"']?\s*[:=]\s*[\"']?)(?!REDACTED)(?:(?i:bearer|basic|digest)\s+)?[^\s\"',;}&]{4,}"
    r"|\bsk-[A-Za-z0-9_-]{8,}"
)
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|[\x00-\x1f\x7f-\x9f]+")


def remember(*values: str | None) -> None:
    """Credentials to remove from everything stored from now on (this process)."""
    global _pattern
    new = set()
    for value in values:
        if not value or not isinstance(value, str):
            continue
        value = value.strip()
        parts = [value, *value.split(None, 1)[1:]]  # "Bearer KEY": the key alone too
        for part in parts:
            if len(part) >= MIN_SECRET_CHARS:
                new |= {part, json.dumps(part)[1:-1], quote(part, safe="")}
    with _lock:
        if new - _secrets:
            _secrets.update(new)
            ordered = sorted(_secrets, key=len, reverse=True)  # the longest first: no partial leftovers
            _pattern = re.compile("|".join(re.escape(s) for s in ordered))


def scrub_text(text: str) -> str:
    """`text` without any remembered credential and without credential-shaped tokens."""
    if not text:
        return text
    pattern = _pattern
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    return _SHAPES.sub(_shape, text)


def _shape(m: re.Match) -> str:
    lead = m["lead"] or m["basic"] or m["key"]
    return f"{lead}{REDACTED}" if lead else REDACTED


def strip_control(text: str) -> str:
    """`text` without escape sequences and control characters (tabs and newlines become spaces)."""
    return _CONTROL.sub(" ", text) if _CONTROL.search(text) else text


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """A short, one-line, scrubbed excerpt: what a record keeps of text a server sent."""
    one = " ".join(_CONTROL.sub(" ", str(text)).split())
    one = scrub_text(one)
    return one if len(one) <= limit else one[: limit - 1] + "…"


def scrub_doc(obj):
    """A JSON-ready document with every string (keys too) scrubbed."""
    if isinstance(obj, str):
        return scrub_text(obj)
    if isinstance(obj, dict):
        return {scrub_text(k) if isinstance(k, str) else k: scrub_doc(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_doc(v) for v in obj]
    return obj


def scrub_table(table):
    """A pyarrow Table with every string column scrubbed (Parquet samples are stored strings too)."""
    import pyarrow as pa

    for i, field in enumerate(table.schema):
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            values = [scrub_text(v) if v else v for v in table.column(i).to_pylist()]
            table = table.set_column(i, field, pa.array(values, type=field.type))
    return table


# Query parameters whose values are secrets (Azure's api-key, signed URLs' sig, bearer tokens ...).
SECRET_QUERY = (
    "key",
    "api_key",
    "api-key",
    "apikey",
    "token",
    "access_token",
    "auth",
    "secret",
    "password",
    "sig",
    "signature",
    "code",
    "credential",
    "x-api-key",
)
REDACTED = "REDACTED"


def redact_url(url: str) -> str:
    """The URL without user:password@ and without the values of secret-looking query parameters."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    try:
        netloc = f"{host}:{parts.port}" if parts.port else host
    except ValueError:  # a port that is not one: shown as given (check_url refuses it)
        netloc = parts.netloc.rsplit("@", 1)[-1]
    query = urlencode(
        [(k, REDACTED if k.lower() in SECRET_QUERY else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
