#!/usr/bin/env bash
# One shard of a kvbench night on a SkyPilot node: what the tasks `kvbench nightly --launch sky` writes run
# (their envs name the night, the section, the shard and the whole partition). The setup of sky/nightly.yaml
# has installed kvbench, the config's vLLM and the models.
#
# Multi-node ([machines.KEY] nodes > 1): every node joins one Ray cluster (port 6379; SkyPilot's own Ray
# uses another); the head runs the shard, and vLLM spreads one server over all nodes through it (pipeline
# parallel across nodes, tensor parallel inside each). Workers leave their Ray daemon up and exit.
#
# The shard is written to the node's disk first, then copied to the bucket mount (when the night has one)
# file by file with its manifest last: a shard folder in the bucket without shard.json did not finish.
set -uo pipefail
. ~/kvbench-venv/bin/activate

nodes="${SKYPILOT_NUM_NODES:-1}"
if [ "$nodes" -gt 1 ]; then
  head_ip=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
  if [ "${SKYPILOT_NODE_RANK:-0}" != "0" ]; then
    sleep 10
    ray status --address "$head_ip:6379" >/dev/null 2>&1 || ray start --address "$head_ip:6379" --disable-usage-stats
    exit 0
  fi
  ray status --address "127.0.0.1:6379" >/dev/null 2>&1 || ray start --head --port 6379 --disable-usage-stats
  export RAY_ADDRESS="127.0.0.1:6379" # vLLM's Ray executor joins this cluster, not SkyPilot's
fi

# `kvbench history run` may add an empty history-point commit: it needs an identity
git config user.name "kvbench nightly"
git config user.email "kvbench-nightly@users.noreply.github.com"

folder="$KVBENCH_NIGHT/$KVBENCH_SECTION/shard-$KVBENCH_SHARD-of-$KVBENCH_SHARDS"
local_out="$HOME/kvbench-shards/$folder"
plan="$HOME/kvbench-shard-plan.json"
printf '%s' "$KVBENCH_SHARD_PLAN" >"$plan"
kvbench nightly --config "$KVBENCH_CONFIG" --shard-plan "$plan" --shard "$KVBENCH_SHARD" \
  --night "$KVBENCH_NIGHT" --shard-out "$local_out"
rc=$?

if [ -n "${KVBENCH_BUCKET_DIR:-}" ] && [ -f "$local_out/shard.json" ]; then
  dest="$KVBENCH_BUCKET_DIR/$folder"
  mkdir -p "$dest"
  (cd "$local_out" && find . -type f ! -name shard.json -exec cp --parents {} "$dest/" \;) &&
    cp "$local_out/shard.json" "$dest/shard.json" || {
    echo "kvbench: copying the shard to the bucket failed; it stays in $local_out" >&2
    rc=1
  }
fi
exit $rc
