"""One scrubber for every string kvbench stores or prints that a server, a log or a user controls.

A server's error body may echo the request's headers (`Authorization: Bearer <key>`, a `--header` value);
such text reaches a request's `error`, a dtype's failure, a log tail, a canary's note. Every record
(JSON, through records.write_atomic) and every Parquet sample table passes its strings through `scrub_doc`
/ `scrub_table` before it is written, and the CLI prints through `printing_scrubbed`, so nothing stored or
shown depends on each producer remembering to do it.

What is removed: every credential this process was given (`remember`: header values, API keys, the
password of a user:password@ URL; registered where an Endpoint is made), as a whole token, in its plain,
JSON-escaped, URL-quoted and base64 forms; and anything shaped like one (`Bearer ...`, `Basic ...`,
`Authorization: ...`, `api_key=...`, `sk-...`), whoever sent it. What is never touched: dict keys and
kvbench's own fields (OWNED_FIELDS: the schema, run id, dtype, condition ...), so no credential can rename
kvbench's data; and a credential too short or too word-like to scrub safely is refused up front
(`check_credentials`). `excerpt` also makes a string one short line without control characters (an escape
sequence from a server never reaches a terminal or a page through it).
"""

from __future__ import annotations

import base64
import json
import re
import sys
import threading
from contextlib import contextmanager
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

REDACTED = "REDACTED"
EXCERPT_CHARS = 200  # what a stored error keeps of a server's body
# A credential must be this long and more than a plain word: a shorter or word-like value would redact the
# same word wherever a server's text uses it (and, before whole-token matching, kvbench's own data too).
MIN_SECRET_CHARS = 8
WORDLIKE_CHARS = 12  # letters only and at most this long: a word, not a key
# Header names that carry a credential: such a value must be scrubbable, or the run is refused up front.
CREDENTIAL_HEADER = re.compile(r"(?i)auth|key|token|secret|pass|cookie|session|signature|credential")
# What a remembered value must not touch to count as a whole token (a key inside a longer word is another word).
_EDGE_BEFORE, _EDGE_AFTER = r"(?<![A-Za-z0-9])", r"(?![A-Za-z0-9])"
# Fields kvbench itself writes (identities, vocabularies, the server's own name as kvbench uses it): never
# scrubbed, so a credential can never rename a dtype, a condition or the schema. Dict keys are never scrubbed.
OWNED_FIELDS = frozenset(
    {
        "schema",
        "run_id",
        "machine",
        "kv_cache_dtype",
        "dtype",
        "condition",
        "status",
        "kind",
        "phase",
        "phase_kind",
        "source",
        "task",
        "metric",
        "method",
        "created_at",
        "finished_at",
        "served_model",
        "model",
        "model_name",
        "prompt_sha256",
        "scores_sha256",
    }
)

_lock = threading.Lock()
_secrets: set[str] = set()  # plain, JSON-escaped and URL-quoted forms: matched as whole tokens
_encoded: set[str] = set()  # base64 fragments: matched anywhere (they sit inside a longer base64 run)
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


def unscrubbable(value: str) -> str | None:
    """Why `value` cannot be scrubbed safely from what a server sends back (None: it can): too short, or a plain
    word, which would redact that word wherever it appears."""
    if len(value) < MIN_SECRET_CHARS:
        return f"shorter than {MIN_SECRET_CHARS} characters"
    if value.isalpha() and len(value) <= WORDLIKE_CHARS:
        return f"a plain word (letters only, at most {WORDLIKE_CHARS})"
    return None


def _token(value: str) -> str:
    """The secret part of a header value: the token of `Bearer TOKEN` / `Basic TOKEN`, else the value."""
    scheme, _, rest = value.strip().partition(" ")
    return rest.strip() if rest.strip() and scheme.lower() in ("bearer", "basic", "digest", "token") else value.strip()


def check_credentials(headers: dict[str, str], api_key_flag: str = "--api-key (or OPENAI_API_KEY)") -> None:
    """Refuse, before anything runs, a credential that cannot be scrubbed safely (the value is never echoed):
    the API key (sent as `Authorization: Bearer KEY`) and every header whose name says it carries one."""
    from kvbench.core.errors import UsageError

    for name, value in headers.items():
        if not CREDENTIAL_HEADER.search(name):
            continue
        why = unscrubbable(_token(value))
        if why:
            what = f"--header {name!r}"
            if name == "Authorization" and value.startswith(("Bearer ", "Basic ")):
                what = api_key_flag if value.startswith("Bearer ") else "the user:password@ of --endpoint"
            raise UsageError(
                f"{what}: the credential is {why}, so it cannot be scrubbed safely from what a server sends back "
                f"(that text would be redacted wherever it appears); give the real credential (at least "
                f"{MIN_SECRET_CHARS} characters, more than a plain word)"
            )


def remember_headers(headers: dict[str, str]) -> None:
    """Remember every header value that can be scrubbed safely (credential headers were checked up front:
    check_credentials); a routing header such as `X-Tier: rest` is sent but is no secret, and stays readable."""
    for name, value in headers.items():
        token = _token(value)
        if unscrubbable(token) is None:
            remember(token, value if unscrubbable(value) is None else None)
        elif CREDENTIAL_HEADER.search(name):  # a caller that skipped check_credentials: never store it
            check_credentials({name: value})


def _base64_fragments(secret: str) -> set[str]:
    """The base64 characters that encode `secret` at each of the three byte alignments it can have inside a
    longer base64 text (standard and URL-safe alphabets): found wherever a server base64-encodes it."""
    data = secret.encode()
    out = set()
    for offset in range(3):
        enc = base64.b64encode(bytes(offset) + data).decode()
        start, stop = -(-8 * offset // 6), 8 * (offset + len(data)) // 6
        fragment = enc[start:stop]
        if len(fragment) >= MIN_SECRET_CHARS:
            out |= {fragment, fragment.replace("+", "-").replace("/", "_")}
    return out


def remember(*values: str | None) -> None:
    """Credentials to remove from everything stored or printed from now on (this process): each value that
    can be scrubbed safely (unscrubbable), with its JSON-escaped, URL-quoted and base64 forms."""
    global _pattern
    plain, encoded = set(), set()
    for value in values:
        if not value or not isinstance(value, str):
            continue
        value = value.strip()
        for part in {value, _token(value)}:
            if unscrubbable(part) is None:
                plain |= {part, json.dumps(part)[1:-1], quote(part, safe="")}
                encoded |= _base64_fragments(part)
    with _lock:
        if plain - _secrets or encoded - _encoded:
            _secrets.update(plain)
            _encoded.update(encoded)
            # the longest first: no partial leftovers
            words = [f"{_EDGE_BEFORE}{re.escape(s)}{_EDGE_AFTER}" for s in sorted(_secrets, key=len, reverse=True)]
            runs = [re.escape(s) for s in sorted(_encoded, key=len, reverse=True)]
            _pattern = re.compile("|".join(words + runs))


def scrub_secrets(text: str) -> str:
    """`text` without any remembered credential (whole tokens; base64 forms anywhere)."""
    pattern = _pattern
    return pattern.sub(REDACTED, text) if pattern is not None and text else text


def scrub_text(text: str) -> str:
    """`text` without any remembered credential and without credential-shaped tokens."""
    if not text:
        return text
    return _SHAPES.sub(_shape, scrub_secrets(text))


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
    """A JSON-ready document with its strings scrubbed: every value but kvbench's own fields (OWNED_FIELDS);
    dict keys are kvbench's too and never touched."""
    if isinstance(obj, str):
        return scrub_text(obj)
    if isinstance(obj, dict):
        return {k: v if k in OWNED_FIELDS else scrub_doc(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_doc(v) for v in obj]
    return obj


def scrub_table(table):
    """A pyarrow Table with its string columns scrubbed (responses, errors, targets), kvbench's own columns
    (OWNED_FIELDS: run id, dtype, condition, task ...) left as they are."""
    import pyarrow as pa

    for i, field in enumerate(table.schema):
        if field.name in OWNED_FIELDS:
            continue
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            values = [scrub_text(v) if v else v for v in table.column(i).to_pylist()]
            table = table.set_column(i, field, pa.array(values, type=field.type))
    return table


class _ScrubbedStream:
    """A text stream that writes every string without the remembered credentials (the terminal gets what a
    record gets: K-B20, an error body echoing `Authorization` printed in clear)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(scrub_secrets(text) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextmanager
def printing_scrubbed():
    """stdout and stderr scrubbed of remembered credentials while the block runs (the CLI's whole command)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ScrubbedStream(out), _ScrubbedStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


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
