"""What a running server is, asked before any load: the served model, vLLM's version, the KV-cache dtype and
pages it runs (`--endpoint` runs), and how its URL may be written down.

vLLM answers `/v1/models` (id, root = what it loaded, max_model_len), `/version`, and `/metrics`, whose
`vllm:cache_config_info` labels carry every CacheConfig field (cache_dtype, block_size, num_gpu_blocks,
kv_cache_memory_bytes). vLLM's `--api-key` guards only /v1 paths; a proxy in front may guard all, so every
call carries the caller's headers. Headers and credentials are never written down: `redact_url` is the
only form of a URL that reaches a record, a log line or the terminal.
"""

from __future__ import annotations

import base64
import json
import urllib.error
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from kvbench.errors import UsageError
from kvbench.harness import http
from kvbench.harness.promscrape import parse_metrics

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
    netloc = f"{host}:{parts.port}" if parts.port else host
    query = urlencode(
        [(k, REDACTED if k.lower() in SECRET_QUERY else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


@dataclass(frozen=True)
class Endpoint:
    """A server to measure: its URL (no userinfo; secret query values kept, they may be needed) and the
    headers every request carries (API key, user:password@ as Basic auth, --header). Never recorded."""

    url: str
    headers: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def redacted(self) -> str:
        return redact_url(self.url)


def with_credentials(url: str, headers: dict[str, str]) -> Endpoint:
    """Move user:password@ out of the URL into a Basic Authorization header (urllib cannot send it)."""
    parts = urlsplit(url)
    out = dict(headers)
    if parts.username is not None:
        token = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode()
        out.setdefault("Authorization", f"Basic {token}")
        netloc = parts.netloc.rsplit("@", 1)[1]
        url = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return Endpoint(url, out)


def check_url(url: str, flag: str = "--endpoint") -> str:
    """An http(s) URL with a host, without a trailing slash; one line naming the valid form if not."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"{flag} {redact_url(url)!r} is not an http(s) URL with a host; give e.g. http://127.0.0.1:8000"
        )
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise UsageError(f"{flag} {redact_url(url)!r} has an invalid port; give e.g. http://127.0.0.1:8000") from None
    if parts.query or parts.fragment:
        # kvbench appends vLLM's routes (/v1/completions, /metrics, /health) to the base URL: a query cannot ride along
        raise UsageError(
            f"{flag} {redact_url(url)!r} has a query string; give the base URL only and pass a key with "
            "--api-key (or OPENAI_API_KEY) or --header 'NAME: VALUE'"
        )
    return url.strip().rstrip("/")


def parse_endpoints(text: str) -> dict[str | None, str]:
    """`URL` -> {None: URL}; `auto=URL1,fp8=URL2` -> {"auto": URL1, "fp8": URL2} (one server per dtype)."""
    text = text.strip()
    if not text:
        raise UsageError("--endpoint is empty; give a URL, or DTYPE=URL pairs: auto=http://h:8000,fp8=http://h:8001")
    if "=" not in text.split("://", 1)[0] and "," not in text:
        return {None: check_url(text)}  # one server (its dtype comes from the server)
    out: dict[str | None, str] = {}
    for part in text.split(","):
        dtype, sep, url = part.strip().partition("=")
        if not sep or "://" in dtype or not dtype:
            raise UsageError(
                f"--endpoint entry {redact_url(part.strip())!r} must be DTYPE=URL when several are given, "
                "e.g. auto=http://h:8000,fp8=http://h:8001"
            )
        if dtype in out:
            raise UsageError(f"--endpoint names {dtype!r} twice; give one server per KV dtype")
        out[dtype.strip()] = check_url(url, f"--endpoint {dtype}")
    return out


def parse_headers(values: list[str] | None) -> dict[str, str]:
    """`--header 'K: V'` (or K=V is refused: a value may contain '='): {K: V}."""
    out = {}
    for item in values or []:
        name, sep, value = item.partition(":")
        if not sep or not name.strip() or any(c in name for c in " \t\r\n"):
            raise UsageError(f"--header {name.strip()!r}...: give NAME:VALUE, e.g. --header 'X-Team: serving'")
        out[name.strip()] = value.strip()
    return out


@dataclass
class ServerFacts:
    """What the server said about itself."""

    base_url: str  # as given (may carry credentials: never record it, record `redacted`)
    served_model: str
    model_root: str | None
    max_model_len: int | None
    vllm_version: str | None
    cache_config: dict[str, str] = field(default_factory=dict)  # vllm:cache_config_info labels ({} if absent)

    @property
    def redacted(self) -> str:
        return redact_url(self.base_url)

    @property
    def cache_dtype(self) -> str | None:
        value = self.cache_config.get("cache_dtype")
        return value if value not in (None, "", "None") else None


def describe(base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> ServerFacts:
    """Ask the server what it is; a one-line UsageError when it does not answer as an OpenAI-compatible vLLM."""
    headers = dict(headers or {})
    shown = redact_url(base_url)
    try:
        status, body = http.get(f"{base_url}/v1/models", headers, timeout_s)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(
            f"--endpoint {shown}: no answer from {shown}/v1/models ({reason}); is the server running?"
        ) from None
    if status in (401, 403):
        raise UsageError(
            f"--endpoint {shown}: the server refused /v1/models (HTTP {status}); pass --api-key KEY "
            "(or set OPENAI_API_KEY) or --header 'NAME: VALUE'"
        )
    if status != 200:
        raise UsageError(f"--endpoint {shown}: /v1/models answered HTTP {status}, not an OpenAI-compatible model list")
    try:
        data = json.loads(body)
        models = data["data"]
        first = models[0]
        served = str(first["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise UsageError(
            f"--endpoint {shown}: /v1/models did not answer as an OpenAI-compatible server "
            '(expected {"data": [{"id": ...}]})'
        ) from None
    if len(models) > 1:
        names = ", ".join(str(m.get("id")) for m in models if isinstance(m, dict))
        raise UsageError(f"--endpoint {shown} serves several models ({names}); kvbench measures one model per server")
    max_len = first.get("max_model_len")
    version = None
    try:
        status, body = http.get(f"{base_url}/version", headers, timeout_s)
        if status == 200:
            version = str(json.loads(body).get("version")) or None
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        pass  # not every OpenAI-compatible server says its version
    cache_config: dict[str, str] = {}
    try:
        status, body = http.get(f"{base_url}/metrics", headers, timeout_s)
        if status == 200:
            cache_config = parse_metrics(body.decode("utf-8", "replace")).cache_config
    except (urllib.error.URLError, OSError, ValueError):
        pass  # no /metrics: capacity and dtype are then unknown, and the record says so
    return ServerFacts(
        base_url=base_url,
        served_model=served,
        model_root=str(first["root"]) if first.get("root") else None,
        max_model_len=int(max_len) if isinstance(max_len, int) and max_len > 0 else None,
        vllm_version=version,
        cache_config=cache_config,
    )
