"""`kvbench run`'s settings are declared once (harness/run/settings.py): the command line is generated from the
fields, the defaults come from the run_defaults.toml key each field names, and the command line's text and
a caller's Python values give the same settings."""

from __future__ import annotations

import pytest

from kvbench.core.datafiles import load_toml
from kvbench.core.errors import UsageError
from kvbench.core.flags import flag_of
from kvbench.harness.run.settings import RunSettings


def test_the_command_has_one_option_per_flag_field_in_field_order():
    import typer.main
    from rich.markup import escape

    from kvbench.cli.app import app

    command = typer.main.get_command(app).commands["run"]
    options = [p for p in command.params if p.param_type_name == "option" and p.name != "help"]
    fields = [name for name in RunSettings.model_fields if flag_of(RunSettings, name)]
    assert [p.name for p in options] == fields
    for p in options:
        field = RunSettings.model_fields[p.name]
        assert p.help == escape(field.description)  # as written: rich markup escaped (N-P7), never interpreted
        names = flag_of(RunSettings, p.name).names
        assert set(p.opts) | set(p.secondary_opts) == {n for spec in names for n in spec.split("/")}


@pytest.mark.parametrize("on_gpu,section", [(False, "cpu"), (True, "gpu")])
def test_a_setting_not_given_takes_its_backend_default(on_gpu, section):
    table = load_toml("run_defaults.toml")
    s = RunSettings.for_machine(on_gpu)
    assert s.or_default("repeat") == table[section]["repeat"]
    assert s.or_default("realtime") == table[section]["client_realtime"]
    assert s.or_default("stall_timeout_s") == table["run"]["stall_timeout_s"]
    assert RunSettings.for_machine(on_gpu, repeat=5).or_default("repeat") == 5


def test_command_line_text_and_python_values_give_the_same_settings():
    text = RunSettings(concurrency="8,16", kv_dtypes="auto, fp8,auto", search_slo="ttft_p95_ms=300", prices="cpu=0.1")
    values = RunSettings(
        concurrency=[8, 16], kv_dtypes=["auto", "fp8"], search_slo={"ttft_p95_ms": 300}, prices={"cpu": 0.1}
    )
    assert text == values


def test_a_bad_setting_is_the_flags_one_line_usage_error():
    with pytest.raises(UsageError, match=r"^--eval-limit must be a whole number >= 1, got 0$"):
        RunSettings(eval_limit=0)
