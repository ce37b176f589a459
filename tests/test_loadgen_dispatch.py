"""Open-loop wake-ups (kvbench.harness.waketimer): correctness, not speed
(the schedule lag they buy is tracked by benchmarks/bench_client.py and scripts/client_vs_vllm.py)."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from kvbench.harness import scheduler, waketimer
from kvbench.harness.backend import OpenAIBackend
from kvbench.harness.fakeserver import FakeConfig, FakeServer
from kvbench.harness.scheduler import Concurrency, Rate, run_load
from kvbench.harness.waketimer import WakeTimer


@pytest.fixture(scope="module")
def fake():
    with FakeServer(FakeConfig()) as srv:
        yield srv


@pytest.mark.parametrize("precise", [True, False])
def test_wake_timer_never_returns_before_its_deadline(precise, monkeypatch):
    if not precise:
        monkeypatch.setattr(waketimer, "_libc", lambda: None)  # no timerfd: asyncio.sleep

    async def main():
        timer = WakeTimer()
        early = []
        try:
            for k in range(40):
                deadline = time.perf_counter() + (k % 5) * 0.0003 - 0.0002  # some already past
                await timer.sleep_until(deadline)
                early.append(time.perf_counter() - deadline)
            return timer.precise, early
        finally:
            timer.close()

    used, late = asyncio.run(main())
    assert used is (precise and waketimer._libc() is not None)
    assert min(late) >= 0


def test_wake_timer_survives_a_cancelled_sleep():
    async def main():
        timer = WakeTimer()
        try:
            task = asyncio.ensure_future(timer.sleep_until(time.perf_counter() + 0.05))
            await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            deadline = time.perf_counter() + 0.002
            await timer.sleep_until(deadline)  # the stale arming must not wake this one early
            return time.perf_counter() - deadline
        finally:
            timer.close()

    assert asyncio.run(main()) >= 0
