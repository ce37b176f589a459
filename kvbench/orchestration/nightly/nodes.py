"""The machines of a multi-node night ([machines.KEY] nodes > 1): vLLM serves one model over several nodes
through Ray (sky/shard.sh starts the cluster), so a run's record must name every node it ran on, not only
the head it was started from.

The nodes are read from Ray itself, in a subprocess (the night's process never joins the cluster it lends to
vLLM): address, host name and GPUs of every live node, ranked as SkyPilot ranks them (SKYPILOT_NODE_IPS).
The night waits for all of them to join before it starts, so a server never comes up on part of its GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from kvbench.core.errors import KvbenchError

PROBE = """
import json, ray
ray.init(address="auto", logging_level="ERROR")
print(json.dumps([
    {"ip": n["NodeManagerAddress"], "host": n["NodeManagerHostname"], "gpus": n["Resources"].get("GPU", 0)}
    for n in ray.nodes() if n.get("Alive")
]))
"""


def ray_nodes(python: str = sys.executable, run=subprocess.run) -> tuple[list[dict], str | None]:
    """(live nodes of the Ray cluster at RAY_ADDRESS, why none could be read)."""
    try:
        out = run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], str(exc)
    if out.returncode != 0:
        tail = (out.stderr or "").strip().splitlines()
        return [], tail[-1] if tail else f"exit {out.returncode}"
    try:
        return json.loads(out.stdout.strip().splitlines()[-1]), None
    except (IndexError, json.JSONDecodeError):
        return [], "no node list in Ray's answer"


def ranked(nodes: list[dict], ips: list[str]) -> list[dict]:
    """Nodes with SkyPilot's rank (its SKYPILOT_NODE_IPS order; head first), sorted by it."""
    order = {ip: i for i, ip in enumerate(ips)}
    out = [{"rank": order.get(n["ip"]), **n} for n in nodes]
    return sorted(out, key=lambda n: (n["rank"] is None, n["rank"] if n["rank"] is not None else 0, n["ip"]))


def cluster(expected: int, timeout_s: float = 600, poll_s: float = 10, probe=ray_nodes) -> list[dict]:
    """Every node of the cluster once `expected` have joined; KvbenchError naming who is missing after timeout_s."""
    ips = os.environ.get("SKYPILOT_NODE_IPS", "").split()
    deadline = time.monotonic() + timeout_s
    while True:
        nodes, why = probe()
        if len(nodes) >= expected:
            return ranked(nodes, ips)
        if time.monotonic() >= deadline:
            seen = {n["ip"] for n in nodes}
            missing = [ip for ip in ips if ip not in seen] or ["?"]
            raise KvbenchError(
                f"{len(nodes)} of {expected} nodes joined the Ray cluster in {timeout_s:g} s "
                f"(missing: {', '.join(missing)}{'; ' + why if why else ''}); a multi-node server needs all of them"
            )
        time.sleep(poll_s)
