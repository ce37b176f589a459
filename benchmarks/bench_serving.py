"""asv: the serving metrics of kvbench/data/metrics.toml (source "run"; "prefix": the prefix-cache scenario),
one `track_<name>` each, parameterized by KV dtype. `setup_cache` runs ONE `kvbench run`
(kvbench.orchestration.suite.serving_numbers); every track only reads its number. A dtype the installed vLLM does not
accept, or that produced no number, raises NotImplementedError in `setup`, which asv records as NaN ("n/a").

The track methods are generated from metrics.toml so the suite cannot drift from it; the benchmark set is
the same on every machine."""

import math
from pathlib import Path

from kvbench.orchestration.suite import REAL_MODEL, prefix_numbers, serving_numbers
from kvbench.specs.tracked import KV_DTYPES, as_track, metrics

ROOT = Path(__file__).resolve().parents[1]  # the asv project: asv.conf.json, results/


class _PerDtype:
    """One kvbench run in setup_cache, one number per KV dtype in each track."""

    params = list(KV_DTYPES)
    param_names = ["kv_dtype"]
    timeout = 3600  # also bounds setup_cache: three vLLM servers, SLO searches and fixed loads
    rounds = 1
    repeat = 1
    number = 1

    def setup(self, run, kv_dtype):
        numbers = run["dtypes"].get(kv_dtype)
        if numbers is None or numbers["status"] == "unsupported":
            raise NotImplementedError(f"{kv_dtype}: not run ({(numbers or {}).get('status', 'absent')})")
        self.numbers = numbers


def _track(metric):
    def track(self, run, kv_dtype):
        value = metric.from_field(self.numbers.get(metric.field))
        if math.isnan(value):
            # no number for this dtype (e.g. the engine died before the phase): n/a, not a failure
            from asv_runner.benchmarks.mark import SkipNotImplemented

            raise SkipNotImplemented(f"{metric.name} not measured for {kv_dtype}")
        return value

    return as_track(track, metric)


class Serving(_PerDtype):
    version = "kvbench.serving/1"  # keeps history across cosmetic edits; bump when a measurement changes

    def setup_cache(self):
        return serving_numbers(ROOT)


class PrefixCache(_PerDtype):
    """The prefix-cache scenario (shared system prompts): vLLM's hit rate and TTFT per dtype, one run per asv run."""

    version = "kvbench.prefix/1"

    def setup_cache(self):
        return prefix_numbers(ROOT)


class RealModel(_PerDtype):
    """A real pretrained model's own run (kvbench.orchestration.suite.REAL_MODEL, from its registry package; its plan in
    kvbench/data/realmodel_runs.toml): its KLD, task accuracy and capacity per dtype, a series of its own."""

    version = "kvbench.realmodel/1"
    timeout = 5400  # three dtypes of a 135M model on 2 cores: about 30 minutes

    def setup_cache(self):
        return serving_numbers(ROOT, model=REAL_MODEL)


for _m in metrics():
    if _m.source == "realmodel":
        setattr(RealModel, f"track_{_m.name}", _track(_m))
    if _m.source == "run":
        setattr(Serving, f"track_{_m.name}", _track(_m))
    elif _m.source == "prefix":
        setattr(PrefixCache, f"track_{_m.name}", _track(_m))
