"""Open-loop wake-ups (kvbench.harness.waketimer) and the collector during a run: correctness, not speed
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


@pytest.mark.parametrize("mode", [Concurrency(4), Rate(500, burstiness=1.0)])
def test_collector_is_suspended_during_a_run_and_restored(fake, mode):
    seen = []
    prompts = [[1, 2, 3]] * 20
    lr = asyncio.run(
        run_load(
            OpenAIBackend(fake.base_url, "kvbench-fake"),
            prompts,
            4,
            mode,
            on_progress=lambda d, t: seen.append(gc.isenabled()),
        )
    )
    assert lr.results and all(r.ok for r in lr.results)
    assert seen and not any(seen)  # no automatic collection could pause the run
    assert gc.isenabled()
    gc.disable()
    try:  # a caller that had it off gets it back off
        asyncio.run(run_load(OpenAIBackend(fake.base_url, "kvbench-fake"), prompts[:4], 4, mode))
        assert not gc.isenabled()
    finally:
        gc.enable()
    asyncio.run(
        run_load(
            OpenAIBackend(fake.base_url, "kvbench-fake"),
            prompts[:4],
            4,
            mode,
            freeze_gc=False,
            on_progress=lambda d, t: seen.append(gc.isenabled()),
        )
    )
    assert seen[-1]  # freeze_gc=False leaves the collector alone


def test_failures_collect_the_young_generation_past_the_bound(monkeypatch):
    collected = []
    monkeypatch.setattr(scheduler, "GC_YOUNG_BOUND", -1)  # every failure is past it
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(a) or real(*a))
    with FakeServer(FakeConfig(fail_every=2)) as srv:
        lr = asyncio.run(run_load(OpenAIBackend(srv.base_url, "kvbench-fake"), [[1, 2]] * 8, 2, Concurrency(2)))
    assert sum(not r.ok for r in lr.results) == 4
    assert collected == [(), (0,), (0,), (0,), (0,)]  # the full one before the run, then once per failure only
