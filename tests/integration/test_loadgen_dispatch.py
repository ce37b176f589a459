"""Open-loop wake-ups (kvbench.harness.client.waketimer) and the collector during a run: correctness, not speed
(the schedule lag they buy is tracked by benchmarks/bench_client.py and scripts/client_vs_vllm.py)."""

from __future__ import annotations

import asyncio
import gc
import math
import time

import pytest

from kvbench.harness.client import scheduler, waketimer
from kvbench.harness.client.backend import OpenAIBackend
from kvbench.harness.client.scheduler import Concurrency, Rate, run_load
from kvbench.harness.client.waketimer import WakeTimer
from kvbench.testing.fakeserver import FakeConfig, FakeServer


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


def test_wake_timer_wakes_many_waiters_in_deadline_order_never_early():
    async def main():
        timer = WakeTimer()
        woke = []

        async def wait(deadline, k):
            await timer.sleep_until(deadline)
            woke.append((k, time.perf_counter() - deadline))

        try:
            t0 = time.perf_counter() + 0.005
            deadlines = [t0 + (k * 7 % 10) * 0.0004 for k in range(30)]  # out of order, some equal
            await asyncio.gather(*(wait(d, k) for k, d in enumerate(deadlines)))
            return deadlines, woke
        finally:
            timer.close()

    deadlines, woke = asyncio.run(main())
    assert min(late for _, late in woke) >= 0
    order = [k for k, _ in woke]
    assert [deadlines[k] for k in order] == sorted(deadlines)


def test_open_loop_requests_started_ahead_are_sent_on_time_or_not_at_all(fake, monkeypatch):
    """Open loop starts each request SEND_AHEAD_S early and holds it until due: none leaves early, and one
    cancelled while still held is `not_sent`, not a failure."""
    monkeypatch.setattr(scheduler, "SEND_AHEAD_S", 0.02)  # wide, so the cancel below lands inside it
    prompts = [[1, 2, 3]] * 40
    mode = Rate(40.0, burstiness=math.inf)  # due at 25, 50, ..., 250 ms: the 10th is held from 230 ms

    async def main():
        started = asyncio.Event()
        progress = lambda done, total: started.set()  # noqa: E731 (called first at the run's origin)
        backend = OpenAIBackend(fake.base_url, "kvbench-fake")
        task = asyncio.ensure_future(run_load(backend, prompts, 2, mode, on_progress=progress))
        await started.wait()
        await asyncio.sleep(0.24)
        task.cancel()
        return await task

    lr = asyncio.run(main())
    assert lr.interrupted
    assert all(r.sent_s is not None and r.schedule_lag_s >= 0 for r in lr.results)
    assert len(lr.results) == 9 and lr.not_sent == 31  # the held 10th was never sent
    assert all(r.ok for r in lr.results)
