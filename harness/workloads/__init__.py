"""Workloads as data: a validated spec per kind (fixed, random, sharegpt, jsonl, shared-prefix, multi-turn,
trace), the `--workload` shorthand and named TOML workloads, and `build`, which turns a spec into a
`RequestPlan` of exact-length requests.

    spec = parse_workload("shared-prefix:groups=8,prefix=256,suffix=64,output=32,requests=64")
    plan = build(spec, tokenizer, seed=0, stream=3, max_model_len=512)
    plan.requests[0].prompt, plan.requests[0].output_tokens, plan.stats["prefix"]
"""

from kvbench.harness.workloads.build import build, read_trace
from kvbench.harness.workloads.plan import PlannedRequest, RequestPlan, Session, walk_sessions
from kvbench.harness.workloads.shorthand import FORMS, load_workloads, named_workload, parse_workload
from kvbench.harness.workloads.spec import (
    KINDS,
    FixedSpec,
    JsonlSpec,
    MultiTurnSpec,
    RandomSpec,
    SharedPrefixSpec,
    ShareGPTSpec,
    TraceSpec,
    WorkloadSpec,
    parse_spec,
)

__all__ = [
    "FORMS",
    "KINDS",
    "FixedSpec",
    "JsonlSpec",
    "MultiTurnSpec",
    "PlannedRequest",
    "RandomSpec",
    "RequestPlan",
    "Session",
    "SharedPrefixSpec",
    "ShareGPTSpec",
    "TraceSpec",
    "WorkloadSpec",
    "build",
    "load_workloads",
    "named_workload",
    "parse_spec",
    "parse_workload",
    "read_trace",
    "walk_sessions",
]
