"""When requests go: closed-loop concurrency, open-loop arrival rates, sweeps.

Every request carries its intended send time. For a rate, the whole schedule is drawn up front (seeded),
so a client or a concurrency cap that falls behind shows up as schedule lag (`sent - intended`) instead of
silently stretching the run (coordinated omission). For a fixed concurrency the intended time is the
moment a slot freed up, so the lag is the client's own dispatch delay.

A no-progress watchdog ends a run when requests are in flight but no byte has arrived anywhere for
`stall_timeout_s`: outstanding requests are cancelled and marked failed ("no progress for N s"), and the
partial result is returned. Cancelling `run_load` (Ctrl-C under `asyncio.run`) cancels every request,
closes what it opened and returns what was measured so far with `interrupted=True`; the caller decides
the exit status. Nothing here prints; `on_progress` feeds the CLI's progress bar.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
import uuid
from collections.abc import Callable, Sequence

from kvbench.harness.client.backend import OpenAIBackend, RequestResult
from kvbench.harness.client.clientsched import Realtime, policy_name, thread_cpu_and_wait_s
from kvbench.harness.client.loadmodes import RNGS, Concurrency, Rate, Sessions, Timed, arrival_schedule
from kvbench.harness.client.loadresult import LoadResult
from kvbench.harness.client.waketimer import WakeTimer
from kvbench.harness.client.workload import Prompt

# The load modes and LoadResult stay importable from here, where callers have always found them.
__all__ = [
    "RNGS",
    "Concurrency",
    "LoadResult",
    "Rate",
    "Sessions",
    "Timed",
    "arrival_schedule",
    "run_load",
    "run_sweep",
    "sustain_load",
]


# With automatic collection suspended for a run (run_load's freeze_gc), the young generation is collected
# once it holds this many objects, when a request fails (only failures leave cycles): a bound on memory.
GC_YOUNG_BOUND = 1_000_000
# Open loop: how long before its send time a request is started (to build its body and wait on the timer).
SEND_AHEAD_S = 0.002


class _Run:
    """State of one run: in-flight tasks, counters, the watchdog's last-progress stamp."""

    def __init__(self, backend, prompts, output_tokens, mode, stall_timeout_s, on_progress):
        self.backend = backend
        self.prompts = prompts
        self.output_tokens = output_tokens
        self.mode = mode
        self.stall_timeout_s = stall_timeout_s
        self.on_progress = on_progress
        self.origin = 0.0
        self.results: dict[int, RequestResult] = {}
        self.tasks: set[asyncio.Task] = set()
        self.in_flight = 0
        self.completed = 0
        self.failed = 0
        self.last_progress = time.perf_counter()
        self.stop_reason: tuple[str, str] | None = None  # (error_kind, message) for cancelled requests
        self.end: float | None = None
        self.timer: WakeTimer | None = None  # open loop: wakes requests when they are due
        self.run_id = uuid.uuid4().hex[:12]  # request ids must be unique on the server across runs

    def touch(self) -> None:
        self.last_progress = time.perf_counter()

    def report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.completed + self.failed, len(self.prompts))

    def output_for(self, i: int) -> int:
        """Request i's exact output length: one for all, or one per request (workloads with lengths)."""
        return self.output_tokens if isinstance(self.output_tokens, int) else int(self.output_tokens[i])

    async def request(self, i: int, intended_s: float, not_before: float | None = None) -> RequestResult:
        """Send request i. not_before: perf_counter() time it is due; it is prepared now and sent then."""
        prompt = self.prompts[i]
        r = RequestResult(
            index=i,
            request_id=f"kvbench-{self.run_id}-{i}",
            requested_output_tokens=self.output_for(i),
            expected_prompt_tokens=prompt.num_tokens,
            intended_send_s=intended_s,
        )
        sent = False

        def start() -> None:
            nonlocal sent
            self.results[i] = r  # only what is sent is a result; a request cancelled before is `not_sent`
            if self.in_flight == 0:
                self.touch()  # the watchdog measures silence only while something is outstanding
            self.in_flight += 1
            sent = True

        async def when_due() -> None:  # the backend awaits this right before it stamps and sends
            await self.timer.sleep_until(not_before)
            start()

        if not_before is None:
            start()
        try:
            await self.backend.send(
                prompt,
                self.output_for(i),
                result=r,
                origin_s=self.origin,
                on_progress=self.touch,
                before_send=None if not_before is None else when_due,
            )
        except asyncio.CancelledError:
            if sent and self.stop_reason is not None:
                r.error_kind, r.error = self.stop_reason  # the scheduler's reason beats the generic "cancelled"
                r.ok = False
            raise
        finally:
            if sent:
                self.in_flight -= 1
                self.touch()
                if r.ok:
                    self.completed += 1
                else:
                    self.failed += 1
                    if not gc.isenabled() and gc.get_count()[0] > GC_YOUNG_BOUND:
                        gc.collect(0)  # see run_load's freeze_gc
        self.report()
        return r

    def spawn(self, i: int, intended_s: float, not_before: float | None = None) -> asyncio.Task:
        task = asyncio.ensure_future(self.request(i, intended_s, not_before))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def drive(self) -> None:
        """Send every request according to the mode; return when all have finished."""
        n = len(self.prompts)
        clock = time.perf_counter
        if isinstance(self.mode, Concurrency):
            next_index = iter(range(n))

            async def worker():
                intended = 0.0  # the first wave is due at the origin
                for i in next_index:  # a shared iterator: each index is taken once
                    # In the worker itself, not a task of its own: one task and one loop pass fewer per
                    # request. Cancelling the driver still cancels every request in flight (gather).
                    await self.request(i, intended)
                    intended = clock() - self.origin  # the slot is free now; the next send is due now

            await asyncio.gather(*(worker() for _ in range(min(self.mode.concurrency, n))))
        elif isinstance(self.mode, Sessions):
            slots = asyncio.Semaphore(self.mode.max_concurrent)

            async def session(indices: tuple[int, ...]) -> None:
                async with slots:  # a new conversation starts when one ends
                    for i in indices:
                        if self.mode.think_s[i]:
                            await asyncio.sleep(self.mode.think_s[i])  # the user reads and types
                        await self.request(i, clock() - self.origin)  # due when the think time is over

            await asyncio.gather(*(session(s) for s in self.mode.sessions))
        else:
            schedule = arrival_schedule(n, self.mode).tolist()
            slots = asyncio.Semaphore(self.mode.max_concurrency) if self.mode.max_concurrency else None
            pending = []
            self.timer = WakeTimer()  # asyncio.sleep wakes up to 1 ms late: that would be most of the lag
            try:
                for i in range(n):
                    due = self.origin + schedule[i]
                    if slots is None:
                        # Started SEND_AHEAD_S early, the request builds its body, then waits on the timer
                        # itself: when it is due, one loop pass separates the wake-up from the send.
                        if due - SEND_AHEAD_S > clock():
                            await self.timer.sleep_until(due - SEND_AHEAD_S)
                        pending.append(self.spawn(i, schedule[i], not_before=due))
                        continue
                    if due > clock():  # capped: a slot is taken when due, so waiting for one shows as lag
                        await self.timer.sleep_until(due)
                    await slots.acquire()
                    task = self.spawn(i, schedule[i])
                    task.add_done_callback(lambda _t: slots.release())
                    pending.append(task)
                await asyncio.gather(*pending)  # a request task only raises on a client bug: surface it
            finally:
                self.timer.close()
        self.end = clock()

    async def watchdog(self) -> None:
        """Return when requests are outstanding and nothing has arrived for stall_timeout_s."""
        if self.stall_timeout_s is None:
            await asyncio.Event().wait()  # never
        step = max(0.01, min(0.25, self.stall_timeout_s / 4))
        while True:
            await asyncio.sleep(step)
            if self.in_flight > 0 and time.perf_counter() - self.last_progress >= self.stall_timeout_s:
                return


async def run_load(
    backend: OpenAIBackend,
    prompts: Sequence[Prompt | Sequence[int] | str],
    output_tokens: int | Sequence[int],
    mode: Concurrency | Rate | Timed | Sessions,
    *,
    stall_timeout_s: float | None = 60.0,
    on_progress: Callable[[int, int], None] | None = None,
    warmup_prompts: Sequence[Prompt | Sequence[int] | str] = (),
    freeze_gc: bool = True,
    realtime: bool = False,
) -> LoadResult:
    """Run one load against `backend` and return every request's measurements.

    output_tokens: one exact length for every request, or one per request (workloads with length
        distributions, datasets, traces, conversations).
    on_progress(done, total): called once at the start and after every request ends (done counts failures).

    warmup_prompts: sent first (at the same concurrency) and kept in `LoadResult.warmup`, outside every
        statistic: they open the connections and warm the server. Use prompts distinct from `prompts`.
    The backend's session is opened with a connector limit of at least the run's concurrency; if this call
    opened it, it closes it at the end.
    freeze_gc: move everything alive at the start (prompts included) out of the garbage collector's reach
        for the run (a full collection of a heap holding torch and vLLM takes a third of a second on 2
        cores), and suspend automatic collection while it runs, so no collector pause lands in a latency
        or a send. A healthy run leaves no reference cycles (measured: none in 4,000 requests), so nothing
        accumulates; failed requests do leave some (aiohttp's exceptions, ~65 objects each), so the
        young generation is collected once it passes GC_YOUNG_BOUND objects, which bounds the memory.
    realtime: run the event-loop thread under SCHED_FIFO for the run (see clientsched: on a small box a
        busy-waiting server can keep a normal client off the CPU for whole requests). If the OS refuses,
        the run goes on and `LoadResult.client_policy` says what it ran under.
    """
    items = [Prompt.of(p) for p in prompts]
    warm = [Prompt.of(p) for p in warmup_prompts]
    owns = not backend.is_open
    await backend.open(mode.max_in_flight or 0)
    gc_was_enabled = gc.isenabled()
    if freeze_gc:
        gc.collect()
        gc.freeze()
        gc.disable()
    rt = Realtime() if realtime else None
    if rt is not None:
        rt.__enter__()
    try:
        warm_result = None
        if warm:
            warm_mode = Concurrency(min(mode.max_in_flight or len(warm), len(warm)))
            warm_out = (
                output_tokens
                if isinstance(output_tokens, int)
                else [output_tokens[i % len(output_tokens)] for i in range(len(warm))]
            )
            warm_result = await _run(backend, warm, warm_out, warm_mode, stall_timeout_s, None)
            if warm_result.interrupted or warm_result.stalled:
                warm_result.warmup, warm_result.results = warm_result.results, []
                warm_result.requested, warm_result.not_sent = len(items), len(items)
                warm_result.mode = mode.describe()
                return warm_result
        result = await _run(backend, items, output_tokens, mode, stall_timeout_s, on_progress)
        if warm_result is not None:
            result.warmup = warm_result.results
        return result
    finally:
        if rt is not None:
            rt.__exit__(None, None, None)
        if freeze_gc:
            gc.unfreeze()
            if gc_was_enabled:
                gc.enable()
        if owns:
            await asyncio.shield(backend.close())


async def _run(backend, items, output_tokens, mode, stall_timeout_s, on_progress) -> LoadResult:
    run = _Run(backend, items, output_tokens, mode, stall_timeout_s, on_progress)
    interrupted = stalled = False
    started_unix = time.time()
    sched_before = thread_cpu_and_wait_s()
    run.origin = time.perf_counter()
    run.report()
    driver = asyncio.ensure_future(run.drive())
    watchdog = asyncio.ensure_future(run.watchdog())
    try:
        await asyncio.wait({driver, watchdog}, return_when=asyncio.FIRST_COMPLETED)
        if driver.done():
            driver.result()  # re-raise a bug in the driver (or on_progress), after cleanup below
        else:
            stalled = True
            run.stop_reason = ("no_progress", f"no progress for {stall_timeout_s:g} s")
    except asyncio.CancelledError:
        interrupted = True
        run.stop_reason = ("cancelled", "cancelled: run interrupted")
        task = asyncio.current_task()
        if task is not None and hasattr(task, "uncancel"):
            task.uncancel()  # we handle this cancellation by returning the partial result
    finally:
        end = run.end if run.end is not None else time.perf_counter()
        for t in (driver, watchdog, *run.tasks):
            t.cancel()
        await asyncio.gather(driver, watchdog, *list(run.tasks), return_exceptions=True)
    results = [run.results[i] for i in sorted(run.results)]
    sched_after = thread_cpu_and_wait_s()
    cpu_wait = (
        [b - a for a, b in zip(sched_before, sched_after, strict=False)]
        if sched_before and sched_after
        else [None, None]
    )
    return LoadResult(
        results=results,
        duration_s=end - run.origin,
        started_at_monotonic=run.origin,
        interrupted=interrupted,
        stalled=stalled,
        mode=mode.describe(),
        requested=len(items),
        not_sent=len(items) - len(results),
        output_tokens=output_tokens if isinstance(output_tokens, int) else None,
        api=backend.api,
        stall_timeout_s=stall_timeout_s,
        started_at_unix=started_unix,
        prompt_lengths_exact=all(p.exact for p in items) if items else None,
        client_policy=policy_name(),
        client_cpu_s=cpu_wait[0],
        client_runqueue_wait_s=cpu_wait[1],
    )


async def run_sweep(
    backend: OpenAIBackend,
    prompts: Sequence | Callable[[int, Concurrency | Rate], Sequence],
    output_tokens: int,
    modes: Sequence[Concurrency | Rate],
    *,
    stall_timeout_s: float | None = 60.0,
    on_progress: Callable[[int, int, int], None] | None = None,
    stop_on_stall: bool = True,
) -> list[LoadResult]:
    """One `run_load` per mode, in order; one LoadResult each.

    prompts: the same prompts for every point, or `prompts(point_index, mode)` giving each point its own
        (preferred: repeated prompts let the server's prefix cache skip prefill in later points).
    on_progress(point_index, done, total).
    Stops after an interrupted point (and after a stalled one unless stop_on_stall is False), returning the
    points measured so far.
    """
    out = []
    owns = not backend.is_open
    limit = 0 if any(m.max_in_flight is None for m in modes) else max((m.max_in_flight for m in modes), default=0)
    await backend.open(limit)
    try:
        for k, mode in enumerate(modes):
            items = prompts(k, mode) if callable(prompts) else prompts
            cb = (lambda done, total, k=k: on_progress(k, done, total)) if on_progress else None
            res = await run_load(backend, items, output_tokens, mode, stall_timeout_s=stall_timeout_s, on_progress=cb)
            out.append(res)
            if res.interrupted or (res.stalled and stop_on_stall):
                break
    finally:
        if owns:
            await asyncio.shield(backend.close())
    return out


async def sustain_load(
    backend: OpenAIBackend,
    prompts: Callable[[int, int], Sequence],
    output_tokens: int,
    mode: Concurrency | Rate,
    *,
    stall_timeout_s: float | None = 60.0,
    realtime: bool = False,
    flowing: asyncio.Event | None = None,
) -> LoadResult:
    """`mode`'s traffic for as long as the caller needs it: until this task is cancelled.

    `flowing` is set once the first request has come back, so a caller can start what must run beside the
    traffic (an evaluation) only when the traffic is really there.

    It goes out in chunks of fresh prompts, `prompts(chunk_index, n)`, so a load that must outlast something
    of unknown length (an evaluation while the server is busy) never builds its prompts up front. Each chunk
    holds enough requests (eight times the concurrency, or 30 s of arrivals) that the brief drain between
    chunks is a small part of it. Returns every chunk's requests as one LoadResult, `interrupted` (as
    expected) once cancelled; a chunk that stalls ends it early, `stalled`.
    """
    if isinstance(mode, Rate) and math.isfinite(mode.rate):
        size = max(64, math.ceil(mode.rate * 30))
    else:
        size = max(64, 8 * (mode.max_in_flight or 8))
    chunks: list[LoadResult] = []
    owns = not backend.is_open
    await backend.open(mode.max_in_flight or 0)
    interrupted = False
    try:
        for k in range(1_000_000):
            try:
                lr = await run_load(
                    backend,
                    prompts(k, size),
                    output_tokens,
                    mode,
                    stall_timeout_s=stall_timeout_s,
                    realtime=realtime,
                    on_progress=(lambda done, total: done and flowing.set()) if flowing is not None else None,
                )
            except asyncio.CancelledError:  # between two chunks' requests: nothing of this chunk was sent
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                interrupted = True
                break
            chunks.append(lr)
            if lr.interrupted or lr.stalled:
                break
    finally:
        if owns:
            await asyncio.shield(backend.close())
    first = chunks[0] if chunks else None
    return LoadResult(
        results=[r for c in chunks for r in c.results],
        duration_s=sum(c.duration_s for c in chunks),
        started_at_monotonic=first.started_at_monotonic if first else time.perf_counter(),
        interrupted=interrupted or bool(chunks and chunks[-1].interrupted),
        stalled=bool(chunks and chunks[-1].stalled),
        mode={**mode.describe(), "chunks": len(chunks), "chunk_requests": size},
        requested=sum(c.requested for c in chunks),
        not_sent=sum(c.not_sent for c in chunks),
        output_tokens=output_tokens,
        api=backend.api,
        stall_timeout_s=stall_timeout_s,
        started_at_unix=first.started_at_unix if first else None,
        prompt_lengths_exact=first.prompt_lengths_exact if first else None,
        client_policy=first.client_policy if first else None,
    )
