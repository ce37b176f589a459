"""A night step's subprocess and output: stop its process group, read its last line or its JSON, word a change."""

from __future__ import annotations

import json
import os
import signal
import subprocess

KILL_GRACE_S = 60  # after SIGTERM, how long a step may take to stop its vLLM servers and flush


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the step's process group (kvbench turns it into a clean stop), SIGKILL after a grace period."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _json_after_command(text: str) -> dict | None:
    """The JSON document a `--json` command printed (the log's first line is the command)."""
    start = text.find("\n{")
    if start < 0:
        return None
    try:
        return json.loads(text[start + 1 :])
    except json.JSONDecodeError:
        return None


def _fmt_change(r: dict) -> str:
    def val(v):
        return "n/a" if v is None else f"{v:,.4g}"

    change = r.get("change_pct")
    pct = "" if change is None else f" ({change:+.1f}%, allowed ±{r.get('allowed_pct') or 0:.1f}%)"
    return f"{val(r.get('baseline'))} -> {val(r.get('newest'))} {r.get('unit') or ''}{pct}".strip()
