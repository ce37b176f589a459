"""asv: attention-output error per KV dtype (metrics.toml, source "accuracy"), from
kvbench.orchestration.suite.accuracy_numbers: seeded synthetic K/V, deterministic, ~10 s on 2 cores."""

from kvbench.orchestration.suite import accuracy_numbers
from kvbench.specs.tracked import KV_DTYPES, as_track, metrics


class Accuracy:
    params = list(KV_DTYPES)
    param_names = ["kv_dtype"]
    version = "kvbench.accuracy/1"
    timeout = 600
    rounds = 1
    repeat = 1
    number = 1

    def setup_cache(self):
        return accuracy_numbers()


def _track(metric):
    def track(self, numbers, kv_dtype):
        return float(numbers[kv_dtype][metric.field])

    return as_track(track, metric)


for _m in metrics():
    if _m.source == "accuracy":
        setattr(Accuracy, f"track_{_m.name}", _track(_m))
