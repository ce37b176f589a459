#!/usr/bin/env bash
# One prepared GPU run of `kvbench kernels` at a fixed size grid: installs nothing, stops itself well
# inside 8 minutes, writes its records and log under $OUT.
#
#   OUT=/some/dir kernels/run_on_gpu.sh            # on an SM80+ NVIDIA GPU (A100, H100, H200, ...)
#   DRY=1 OUT=/tmp/x kernels/run_on_gpu.sh         # tiny grid in Triton's CPU interpreter: checks the path
#   MODE=sweep OUT=/some/dir kernels/run_on_gpu.sh # the sweep (kernels/sweep.py): every variant and candidate
#                                                  # checked on the device, the grid timed for each, the fastest
#                                                  # correct kept, NVML at 10 Hz and device memory, one record
#   MODE=sweep DRY=1 OUT=/tmp/x kernels/run_on_gpu.sh  # the same in the interpreter (small shape, tiny grid)
#
# Needs: python3 with torch (CUDA build), triton, typer, rich, numpy, pydantic, platformdirs, and for the
# sweep's NVML trace nvidia-ml-py (without it the record says why the trace is missing) (whatever the
# machine has; nothing is installed: put missing pure-Python ones on PYTHONPATH). If kvbench is not
# installed, it is imported from this checkout through a temporary package folder of symlinks (kernels/
# is the subpackage kvbench.kernels, as pyproject.toml maps it).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:?set OUT to the folder for records and the log}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
[[ "$PYTHON" == */* ]] && PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"
# Run from a neutral folder: Python puts the current folder first on sys.path, and from the checkout's root
# that finds the bare kvbench/ folder (no kernels/ or harness/ inside) ahead of the shim below.
cd /

# The fixed grid (Llama-3.1-8B layer: 32 query heads, 8 KV heads, head_dim 128, 16-token pages).
FORMATS="fp16,fp8,nvfp4"
CONTEXTS="1024,4096,16384,32768,131072"
BATCHES="1,8,32"
WRITE_TOKENS="1,8,32,1024,4096,16384,131072"
WALL_S=450      # hard stop (timeout) -- under 8 minutes including start-up
CASES_S=360     # stop starting new cases after this; the record then says "partial"
EXTRA=()
MODE="${MODE:-grid}"
if [[ "$MODE" != "grid" && "$MODE" != "sweep" ]]; then
    echo "run_on_gpu.sh: MODE must be grid (the default) or sweep, got '$MODE'" >&2
    exit 2
fi
if [[ "$MODE" == "sweep" ]]; then WALL_S=470; CASES_S=380; fi  # the sweep: under 8 minutes in all
if [[ "${DRY:-0}" == "1" ]]; then
    CONTEXTS="32"; BATCHES="1"; WRITE_TOKENS="4"; WALL_S=300; CASES_S=240
    EXTRA=(--interpret)
fi

if ! "$PYTHON" -c "import kvbench.kernels" 2>/dev/null; then
    SHIM="$(mktemp -d)"
    trap 'rm -rf "$SHIM"' EXIT
    mkdir "$SHIM/kvbench"
    for f in "$REPO"/kvbench/*; do ln -s "$f" "$SHIM/kvbench/$(basename "$f")"; done
    for sub in kernels harness dashboards; do
        [[ -d "$REPO/$sub" ]] && ln -s "$REPO/$sub" "$SHIM/kvbench/$sub"
    done
    export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
# the sweep imports no CLI code (typer, rich); the NVML trace wants nvidia-ml-py but records why when it is absent
NEEDED="'torch', 'triton', 'typer', 'rich', 'numpy', 'pydantic', 'platformdirs'"
[[ "$MODE" == "sweep" ]] && NEEDED="'torch', 'triton', 'numpy', 'pydantic', 'platformdirs'"
missing=$("$PYTHON" -c "
import importlib.util as u
print(' '.join(m for m in ($NEEDED) if u.find_spec(m) is None))")
if [[ -n "$missing" ]]; then
    echo "run_on_gpu.sh: missing Python packages: $missing (this script installs nothing)" | tee "$OUT/kernels.log" >&2
    exit 3
fi
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu:', torch.cuda.get_device_name() if torch.cuda.is_available() else None)" | tee "$OUT/kernels.log"

# Either mode ends the same way: its exit status, and the records it wrote.
finish() {
    set -e
    echo "run_on_gpu.sh: exit $1; records:" | tee -a "$OUT/kernels.log"
    find "$OUT/results" -name '*.json' 2>/dev/null | tee -a "$OUT/kernels.log"
    exit "$1"
}
set +e
if [[ "$MODE" == "sweep" ]]; then
    # The interpreter must be chosen before triton is first imported.
    [[ "${DRY:-0}" == "1" ]] && export TRITON_INTERPRET=1
    timeout --signal=INT --kill-after=20 "$WALL_S" "$PYTHON" - <<EOF 2>&1 | tee -a "$OUT/kernels.log"
from pathlib import Path
from kvbench.kernels.sweep import run
run(Path("$OUT") / "results", max_seconds=$CASES_S)
EOF
    finish "${PIPESTATUS[0]}"
fi
# Call the command's body directly with its settings: only kvbench.cli.commands.kernels (and its settings) and
# kvbench.kernels get imported.
COLUMNS=160 timeout --signal=INT --kill-after=20 "$WALL_S" "$PYTHON" - "${EXTRA[@]}" <<EOF 2>&1 | tee -a "$OUT/kernels.log"
import sys
from pathlib import Path
from kvbench.cli.commands.kernels import measure
from kvbench.cli.commands.kernels_settings import KernelsSettings
measure(KernelsSettings(formats="$FORMATS", contexts="$CONTEXTS", batches="$BATCHES", write_tokens="$WRITE_TOKENS",
        max_seconds=$CASES_S, results_dir=Path("$OUT") / "results", interpret="--interpret" in sys.argv[1:]))
EOF
finish "${PIPESTATUS[0]}"
