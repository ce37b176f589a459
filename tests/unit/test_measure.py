"""kvbench.orchestration.measure.execute is the harness's execute with the verdict handed in, nothing restated: the same
parameters but `decide`, and the caller's options passed through as one typed object."""

from __future__ import annotations

import inspect

from kvbench.harness.run import runner
from kvbench.harness.run.runplan import RunOptions
from kvbench.orchestration import measure


def test_measure_takes_the_harness_parameters_but_the_verdict():
    harness = inspect.signature(runner.execute).parameters
    ours = inspect.signature(measure.execute).parameters
    assert list(ours) == [name for name in harness if name != "decide"]
    for name, param in ours.items():
        assert (param.kind, param.default, param.annotation) == (
            harness[name].kind,
            harness[name].default,
            harness[name].annotation,
        ), name


def test_measure_hands_the_verdict_and_the_options_to_the_harness(monkeypatch):
    from kvbench.analysis.verdict import decide

    seen = {}

    def fake(plan, reporter=None, options=RunOptions(), *, decide=None):
        seen.update(plan=plan, reporter=reporter, options=options, decide=decide)
        return "record", "path"

    monkeypatch.setattr(runner, "execute", fake)
    options = RunOptions(extra={"asv": {}}, deadline_s=5.0, deadline_note="budget")
    assert measure.execute("plan", "reporter", options) == ("record", "path")
    assert seen == {"plan": "plan", "reporter": "reporter", "options": options, "decide": decide}
