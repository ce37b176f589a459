"""The fake server's hostile answers to token-id requests (issue 42's probe, as fixtures): `prompt_logprobs`
that lie (NaN, +inf, positive, a token twice, mass above 1, fewer than k, wrong shapes), auto's continuation
too long or missing, and 500s that echo the request's credentials. FakeConfig.damage names one; damage_only
limits it to the fidelity requests (prompt_logprobs > 1, and the continuation), or to the agreement's
teacher-forced one (prompt_logprobs = 1)."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

from aiohttp import web

# damage -> what it does to each position of prompt_logprobs ({token id: {logprob, rank, decoded_token}})
_VALUES = {"nan": math.nan, "inf": math.inf, "neginf": -math.inf, "positive": 3.0}
POSITION_DAMAGE = (*_VALUES, "fewk", "massgt1", "strlp", "nonint", "nokey", "huge")
SHAPE_DAMAGE = ("null", "short", "long", "zero_rows", "choices_empty", "listpos")
RAW_DAMAGE = ("dup", "dup0")  # duplicate JSON keys: only raw text can carry them
CONTINUATION_DAMAGE = ("bigcont", "nocont")
ECHO_DAMAGE = ("echo500", "b64echo500")
DAMAGE = (*POSITION_DAMAGE, *SHAPE_DAMAGE, *RAW_DAMAGE, *CONTINUATION_DAMAGE, *ECHO_DAMAGE)


def _targeted(cfg, body: dict[str, Any]) -> bool:
    k = body.get("prompt_logprobs")
    if cfg.damage in CONTINUATION_DAMAGE:
        return bool(body.get("return_token_ids"))
    if k is None:
        return False
    return {"fidelity": int(k) > 1, "agreement": int(k) == 1}.get(cfg.damage_only, True)


def _position(pos: dict | None, damage: str) -> Any:
    if pos is None:
        return None
    if damage in _VALUES:
        return {t: {**v, "logprob": _VALUES[damage]} for t, v in pos.items()}
    if damage == "fewk":  # only the top token (and the sequence's own, where vLLM adds it)
        return dict(sorted(pos.items(), key=lambda kv: kv[1]["rank"])[:1])
    if damage == "massgt1":  # every listed token at logprob -0.05: a mass of about k (20 at top-20)
        return {t: {**v, "logprob": -0.05} for t, v in pos.items()}
    if damage == "strlp":
        return {t: {**v, "logprob": "abc"} for t, v in pos.items()}
    if damage == "nonint":
        return {f"tok{t}": v for t, v in pos.items()}
    if damage == "nokey":
        return {t: {"rank": v["rank"]} for t, v in pos.items()}
    if damage == "huge":  # 2,000 entries: a body far past any real top-k answer
        return {str(5000 + i): {"logprob": -20.0, "rank": 100 + i, "decoded_token": "x"} for i in range(2000)} | pos
    return pos


def _raw(doc: dict, damage: str) -> str:
    """The body as text with one duplicated key per position: "dup" lists the top token twice (JSON keeps the
    last, -0.001), "dup0" spells it "13" and "013"."""
    choice = doc["choices"][0]
    rows, choice["prompt_logprobs"] = choice["prompt_logprobs"] or [], "@@ROWS@@"
    texts = []
    for pos in rows:
        if not pos:
            texts.append(json.dumps(pos))
            continue
        top = min(pos, key=lambda t: pos[t]["rank"])
        twin = {top: {**pos[top], "logprob": -0.001}} if damage == "dup" else {"0" + top: pos[top]}
        texts.append(json.dumps(pos)[:-1] + ", " + json.dumps(twin)[1:])
    return json.dumps(doc).replace('"@@ROWS@@"', "[" + ", ".join(texts) + "]")


def damaged(cfg, request: web.Request, body: dict[str, Any], doc: dict[str, Any]) -> web.Response:
    """The answer to a token-id request under cfg.damage (the honest `doc` when the request is not targeted)."""
    if not cfg.damage or not _targeted(cfg, body):
        return web.json_response(doc)
    damage = cfg.damage
    if damage in ECHO_DAMAGE:  # a misconfigured proxy's 500, with the request's headers (or their base64)
        headers = dict(request.headers)
        if damage == "b64echo500":
            auth = headers.get("Authorization", "")
            return web.json_response({"error": {"trace": base64.b64encode(auth.encode()).decode()}}, status=500)
        return web.json_response({"error": {"message": "upstream failed", "request_headers": headers}}, status=500)
    choice = doc["choices"][0]
    if damage == "bigcont":
        choice["token_ids"] = choice.get("token_ids", []) * 20_000
    elif damage == "nocont":
        choice.pop("token_ids", None)
    elif damage == "choices_empty":
        doc["choices"] = []
    elif damage in SHAPE_DAMAGE:
        rows = choice["prompt_logprobs"]
        choice["prompt_logprobs"] = {
            "null": None,
            "short": rows[:-1],
            "long": [*rows, rows[-1]],
            "zero_rows": [],
            "listpos": [list(r.values()) if r else r for r in rows],
        }[damage]
    elif damage in RAW_DAMAGE:
        return web.Response(text=_raw(doc, damage), content_type="application/json")
    else:
        choice["prompt_logprobs"] = [_position(p, damage) for p in choice["prompt_logprobs"]]
    return web.Response(text=json.dumps(doc), content_type="application/json")  # NaN and Infinity as Python writes
