"""kernels/records.py and the kernels sweep write through the records layer's one clock and one atomic writer,
and still import on a bare GPU box: `MODE=sweep kernels/run_on_gpu.sh` needs only the packages it checks for
(no rich, typer, pandas or pyarrow)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# what kvbench uses elsewhere and the sweep's checked list leaves out
ABSENT = ("rich", "typer", "pandas", "pyarrow", "duckdb", "plotly", "aiohttp", "vllm", "transformers", "lm_eval")


def test_the_sweep_script_checks_for_none_of_the_absent_packages():
    # the premise of the test below: run_on_gpu.sh's sweep list is what a bare box is assumed to have
    script = (ROOT / "kernels" / "run_on_gpu.sh").read_text()
    (needed,) = re.findall(r'\[\[ "\$MODE" == "sweep" \]\] && NEEDED="(.*)"', script)
    names = set(re.findall(r"'(\w+)'", needed))
    assert names and not names & set(ABSENT), names


def test_the_sweep_imports_without_rich_typer_pandas_or_pyarrow():
    code = (
        "import sys\n"
        f"for name in {ABSENT!r}:\n"
        "    sys.modules[name] = None  # import of it raises ImportError\n"
        "import kvbench.kernels.sweep, kvbench.kernels.records\n"
        "from kvbench.records import utc_now, write_atomic\n"
        "print(utc_now().tzname())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "UTC"


def test_kernels_records_has_no_writer_or_clock_of_its_own():
    from kvbench.kernels import records as kernel_records

    assert not hasattr(kernel_records, "write_atomic") and not hasattr(kernel_records, "utc_now")
