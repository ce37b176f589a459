"""vLLM's server process as kvbench starts it: when kvbench is killed outright (SIGKILL, a CI timeout), with
no chance to stop anything, the server still goes with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from kvbench.harness.server import lifecycle as server


@pytest.mark.skipif(server._prctl is None, reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_server_dies_with_the_kvbench_process_that_started_it(tmp_path):
    # The parent starts a long-lived child the way VllmServer.start does, prints its pid, then waits.
    script = textwrap.dedent(
        """
        import os, subprocess, sys, time
        from kvbench.harness.server.lifecycle import _die_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))
        print(child.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    assert child.is_running()
    os.kill(parent.pid, signal.SIGKILL)  # nothing of kvbench's can run now
    parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while child.is_running() and child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
