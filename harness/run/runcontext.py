"""What the phases of a run share: the run-wide state the Runner owns (`RunState`) and one dtype's run in
progress (`DtypeRun`), plus the prompts and traffic every phase draws from the workload.

Every phase has its own prompt seed stream, numbered by what the phase is, so the same phase (and repeat) gets
the same prompts under every dtype, and vLLM's prefix cache never sees a repeat across phases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvbench.harness.client.scheduler import Sessions, Timed
from kvbench.harness.client.workload import Workload, make_prompts
from kvbench.records import DtypeResult, Finding, SampleStore

if TYPE_CHECKING:  # annotations only: the phases import this module, and these names are theirs to build
    from kvbench.core.telemetry import NvmlSampler
    from kvbench.harness.client.backend import OpenAIBackend
    from kvbench.harness.quality.agreement import Canaries
    from kvbench.harness.quality.underload import Evaluator
    from kvbench.harness.run.runplan import Reporter, RunPlan
    from kvbench.harness.server.lifecycle import VllmServer

# Prompt seed streams by phase kind: distinct, and stable across dtypes for pairing (evals: evalphase).
PROBE_STREAM, SWEEP_STREAM, FIXED_STREAM, WARMUP_STREAM = 1_000, 20_000, 30_000, 500_000
# The agreement prompts' seed stream: the same prompts for every dtype, never reused by a load phase.
AGREEMENT_STREAM = 10_000


@dataclass
class RunState:
    """What every dtype of one run shares; the Runner owns it, the phases read and add to it."""

    plan: RunPlan
    reporter: Reporter
    samples: SampleStore  # the run's Parquet samples
    environment: dict  # the record's (its GPUs and vLLM version, for the capacity checks)
    make_server: Callable[[str], VllmServer]  # dtype -> the managed server to start (Runner._server)
    rapl: list  # CPU package energy counters, where the kernel exposes them
    evaluator: Evaluator | None = None  # lm-eval's worker, when the plan has eval tasks
    eval_items: dict = field(default_factory=dict)  # (dtype, condition) -> {task: {doc id: score}}
    reference: list[dict] | None = None  # auto's greedy samples, for end-to-end agreement
    changed: list[Finding] = field(default_factory=list)  # endpoint servers that changed between phases
    fidelity: object = None  # harness/fidelity.Fidelity: the items and auto's reference scores, made on first use
    _tok: object = field(default=None, repr=False)

    @property
    def tokenizer(self):
        """The run's tokenizer, loaded once on first use (a run without prompts never loads it)."""
        if self._tok is None:
            from kvbench.core.tokenizer import load_tokenizer

            self._tok = load_tokenizer(self.plan.tokenizer or self.plan.model)
        return self._tok


@dataclass
class DtypeRun:
    """One dtype's run in progress: its record (`result`), server, client and what rides along its phases."""

    run: RunState
    dtype: str
    result: DtypeResult
    server: VllmServer | None = None  # the managed server (None for an --endpoint)
    nvml: NvmlSampler | None = None  # the dtype's NVML sampler (energy per phase)
    backend: OpenAIBackend | None = None  # the open client, while the phases run
    headers: dict = field(default_factory=dict)  # the endpoint's headers, sent with every request
    canaries: Canaries | None = None  # agreement prompts re-sent inside every load phase

    @property
    def plan(self) -> RunPlan:
        return self.run.plan

    @property
    def max_len(self) -> int | None:
        """The server's max_model_len where it said it, else the plan's."""
        return (self.result.server.max_model_len if self.result.server else None) or self.plan.max_model_len


def prompts(run: RunState, stream: int, n: int):
    """n prompts of the plan's fixed lengths from seed stream `stream`."""
    w = Workload(**{**run.plan.workload.as_dict(), "num_requests": n})
    return make_prompts(w, run.tokenizer, stream=stream)


def traffic(ctx: DtypeRun, stream: int, n: int | None, load):
    """(prompts, output tokens, mode) of a phase: fixed lengths, or the workload's own requests (a
    trace brings its send times, a multi-turn workload its conversations)."""
    plan = ctx.plan
    spec = plan.workload_spec
    if spec is None:
        return prompts(ctx.run, stream, n), plan.workload.output_tokens, load
    from kvbench.harness.workloads import build

    rp = build(
        spec,
        ctx.run.tokenizer,
        seed=plan.workload.seed,
        stream=stream,
        max_model_len=ctx.max_len,
        api=plan.workload.api,
        num_requests=n,
    )
    if rp.timed:
        load = Timed(tuple(r.send_at_s or 0.0 for r in rp.requests))
    elif rp.sessions:
        think = [0.0] * len(rp.requests)
        for r in rp.requests:
            think[r.index] = r.think_s or 0.0
        load = Sessions(
            tuple(tuple(t.index for t in s.turns) for s in rp.sessions),
            tuple(think),
            rp.max_concurrent_sessions or len(rp.sessions),
        )
    return rp.prompts, rp.output_tokens, load
