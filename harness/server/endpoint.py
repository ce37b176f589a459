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
import re
import socket
import urllib.error
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit

from kvbench.core import scrub
from kvbench.core.errors import UsageError
from kvbench.core.scrub import redact_url  # here for callers: defined below http
from kvbench.harness.client import http
from kvbench.harness.server.promscrape import parse_metrics

DTYPE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,32}")  # what a server's cache_dtype must look like to label a dtype
MAX_SAID_CHARS = 512  # what kvbench keeps of a name a server gives itself (a model root, a dtype)


@dataclass(frozen=True)
class Endpoint:
    """A server to measure: its URL (no userinfo; secret query values kept, they may be needed) and the
    headers every request carries (API key, user:password@ as Basic auth, --header). Never recorded."""

    url: str
    headers: dict[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        scrub.remember_headers(self.headers)  # whatever a server echoes of them is never stored nor shown

    @property
    def redacted(self) -> str:
        return redact_url(self.url)


def with_credentials(url: str, headers: dict[str, str]) -> Endpoint:
    """Move user:password@ out of the URL into a Basic Authorization header (urllib cannot send it)."""
    parts = urlsplit(url)
    out = dict(headers)
    if parts.username is not None:
        password = unquote(parts.password or "")
        why = scrub.unscrubbable(password) if password else None
        if why:
            raise UsageError(
                f"--endpoint {redact_url(url)}: the password of user:password@ is {why}, so it cannot be scrubbed "
                "safely from what a server sends back; give the real credential"
            )
        token = base64.b64encode(f"{unquote(parts.username)}:{password}".encode()).decode()
        scrub.remember(password, token)
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
        if has_control(value.strip()):  # CR/LF would smuggle another header in; the value is never echoed
            raise UsageError(
                f"--header {name.strip()!r}: its value holds control characters (CR, LF ...); give one line"
            )
        out[name.strip()] = value.strip()
    return out


def request_headers(headers: dict[str, str] | None, api_key: str | None, endpoint_given: bool) -> dict[str, str]:
    """What every request to the --endpoint servers carries: the --header values, and the bearer key as
    Authorization unless a header already sets it. `kvbench run` and `kvbench eval` check them here: refused
    without --endpoint (kvbench's own servers need none), and a credential too short or common to scrub is
    refused up front, never echoed."""
    from kvbench.core.scrub import check_credentials

    out = dict(headers or {})
    if api_key is not None:
        out.setdefault("Authorization", f"Bearer {api_key}")
    if out and not endpoint_given:
        raise UsageError("--api-key/--header are for --endpoint servers; kvbench's own servers need none")
    check_credentials(out)
    return out


def has_control(text: str) -> bool:
    """Control characters (CR, LF, escapes): never part of a header value or a key."""
    return any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text)


def check_api_key(key: str) -> str:
    """--api-key (or OPENAI_API_KEY) stripped; empty, or with control characters: one line, the key never echoed."""
    if not key.strip():
        raise UsageError("--api-key (or OPENAI_API_KEY) is empty; give the key, or unset it")
    if has_control(key.strip()):
        raise UsageError("--api-key (or OPENAI_API_KEY) holds control characters (CR, LF ...); give the key alone")
    return key.strip()


@dataclass
class ServerFacts:
    """What the server said about itself."""

    base_url: str  # as given (may carry credentials: never record it, record `redacted`)
    served_model: str
    model_root: str | None
    max_model_len: int | None
    vllm_version: str | None
    cache_config: dict[str, str] = field(default_factory=dict)  # vllm:cache_config_info labels ({} if absent)
    metrics_note: str | None = None  # why /metrics said nothing, where it did not answer as Prometheus text

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
    except http.RedirectRefused as exc:
        raise UsageError(f"--endpoint {shown}: {exc.reason}") from None
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
        hint = "; drop the trailing /v1: kvbench adds it" if urlsplit(base_url).path.rstrip("/").endswith("/v1") else ""
        raise UsageError(
            f"--endpoint {shown}: /v1/models answered HTTP {status}, not an OpenAI-compatible model list{hint}"
        )
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
    # one plain line (checked without the scrubber: a routing header's value may be the model's name)
    if len(served) > MAX_SAID_CHARS or " ".join(scrub.strip_control(served).split()) != served:
        raise UsageError(
            f"--endpoint {shown}: the server's model id is not a plain name ({len(served):,} characters"
            f"{', with control characters or spaces' if len(served) <= MAX_SAID_CHARS else ''}); "
            "kvbench sends it back in every request and names records by it"
        )
    if len(models) > 1:
        names = ", ".join(str(m.get("id")) for m in models if isinstance(m, dict))
        raise UsageError(f"--endpoint {shown} serves several models ({names}); kvbench measures one model per server")
    max_len = first.get("max_model_len")
    cache_config, metrics_note = _cache_config(base_url, headers, timeout_s)
    said = cache_config.get("cache_dtype")
    if said and not DTYPE_NAME.fullmatch(said):  # it becomes the dtype's label: names and paths use it
        raise UsageError(
            f"--endpoint {shown}: /metrics says cache_dtype {said[:40]!r}, which is not a KV-cache dtype name "
            "(letters, digits, _ . -; at most 32); is it a vLLM server?"
        )
    return ServerFacts(
        base_url=base_url,
        served_model=served,
        model_root=_said(first.get("root"), "model root"),
        max_model_len=int(max_len) if isinstance(max_len, int) and max_len > 0 else None,
        vllm_version=_version(base_url, headers, timeout_s),
        cache_config=cache_config,
        metrics_note=metrics_note,
    )


def _said(value, what: str, limit: int = MAX_SAID_CHARS) -> str | None:
    """A string a server says about itself, as kvbench keeps it: one line, no control characters, bounded."""
    if value is None or value == "":
        return None
    text = scrub.excerpt(str(value), limit)
    return text or None


def _version(base_url: str, headers: dict[str, str], timeout_s: float) -> str | None:
    """/version's `version` (None where the server does not say one: not every OpenAI-compatible server does)."""
    try:
        status, body = http.get(f"{base_url}/version", headers, timeout_s)
        version = json.loads(body).get("version") if status == 200 else None
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return None
    return _said(version, "version", 64) if isinstance(version, str) and version.strip() else None


def _cache_config(base_url: str, headers: dict[str, str], timeout_s: float) -> tuple[dict[str, str], str | None]:
    """vllm:cache_config_info's labels from /metrics ({} where it has none), and a note where /metrics is not
    Prometheus text or does not answer (capacity and dtype are then unknown, and the record says so)."""
    try:
        status, body = http.get(f"{base_url}/metrics", headers, timeout_s)
    except (urllib.error.URLError, OSError, ValueError):
        return {}, "no answer from /metrics: the engine's capacity is unknown"
    if status != 200:
        return {}, f"/metrics answered HTTP {status}: the engine's capacity is unknown"
    try:
        config = parse_metrics(body.decode("utf-8", "replace")).cache_config
    except Exception:  # prometheus_client's parser raises ValueError, IndexError ... on what is not its format
        return {}, "/metrics is not Prometheus text: the engine's capacity and KV dtype are unknown"
    return {k: _said(v, k) or "" for k, v in config.items()}, None


# -- one server, one label; the same server from start to end --------------------------------------------


def _addresses(url: str) -> tuple[str, int, frozenset[str]]:
    """(scheme, port, the addresses its host resolves to): localhost and 127.0.0.1 share one."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = (parts.hostname or "").lower()
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        found = set()
    return parts.scheme, port, frozenset(found | {host})


def refuse_shared_servers(labelled: dict[str, tuple[Endpoint, ServerFacts]]) -> None:
    """Two labels on one origin measure one server twice under two names: refused, unless that server states
    its KV dtype (then each label was checked against it, and a contradiction already refused)."""
    seen: list[tuple[str, Endpoint, tuple]] = []
    for dtype, (ep, facts) in labelled.items():
        scheme, port, addrs = _addresses(ep.url)
        for other, other_ep, (o_scheme, o_port, o_addrs) in seen:
            unchecked = facts.cache_dtype is None or labelled[other][1].cache_dtype is None
            if unchecked and scheme == o_scheme and port == o_port and addrs & o_addrs:
                raise UsageError(
                    f"--endpoint {other}={other_ep.redacted} and {dtype}={ep.redacted} are one server "
                    f"(port {port} on the same host), which does not say its KV dtype: two labels would file one "
                    "measurement under two dtypes; give each dtype its own server"
                )
        seen.append((dtype, ep, (scheme, port, addrs)))


def server_changes(before, after: ServerFacts) -> list[str]:
    """What differs between what a server said at the start (a records.ServerInfo) and now: model, context and
    cache configuration (a server restarted with another cache between phases). Unsaid values are not compared."""
    now = {
        "served model": after.served_model,
        "model root": after.model_root,
        "max_model_len": after.max_model_len,
        "cache_dtype": after.cache_dtype,
        "block_size": _int_or_none(after.cache_config.get("block_size")),
        "num_gpu_blocks": _int_or_none(after.cache_config.get("num_gpu_blocks")),
    }
    then = {
        "served model": before.served_model,
        "model root": before.model_root,
        "max_model_len": before.max_model_len,
        "cache_dtype": before.cache_dtype,
        "block_size": before.block_size,
        "num_gpu_blocks": before.num_gpu_blocks,
    }
    return [f"{k} {then[k]!s} -> {now[k]!s}" for k in now if then[k] is not None and now[k] != then[k]]


def _int_or_none(value) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return None


def served_vllm(client: dict, versions: list[str | None]) -> dict:
    """The record's `environment.vllm` for an --endpoint run: what was measured is the server's vLLM (its
    /version, or "unknown"), never this machine's install, which is kept as `client`."""
    said = sorted({v for v in versions if v})
    return {
        "package": "vllm (endpoint)",
        "version": ", ".join(said) if said else "unknown",
        "source": "the server's /version" if said else "the server did not say (no /version)",
        "client": client,
    }
