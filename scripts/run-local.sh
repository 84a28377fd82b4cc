#!/usr/bin/env bash
# Run the main job with `flwr run .` on a local simulation SuperLink that this
# script owns: its own FLWR_HOME (.flwr-home/) and stopped again at the end.
# Usage: scripts/run-local.sh [NUM_SUPERNODES] [run-config overrides...]
#   e.g. scripts/run-local.sh 5 "dataset='chest-xray' data-dir='../shared/data/chest-xray'"
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
NUM_SUPERNODES=${1:-5}
shift || true
export PATH="$ROOT/.venv/bin:$PATH"
export FLWR_HOME="$ROOT/.flwr-home"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$FLWR_HOME"

# Node identities (issue 12): one signing key per simulated node and the roster, made once
# per node count; the FHE AUC and SecSV phases refuse to run without them.
IDS="$ROOT/.fedeval-ids/$NUM_SUPERNODES"
if [ ! -f "$IDS/roster.json" ]; then
  python -m flwr_fedeval.keys create --out "$IDS" --nodes "$NUM_SUPERNODES" >/dev/null
fi

stop_superlink() {
  # The local SuperLink started by `flwr run` keeps running after the run;
  # stop it unless it was already running (another run of ours still uses it).
  if [ "$ALREADY_RUNNING" = 0 ]; then
    pkill -f "flower-superlink.*$FLWR_HOME" 2>/dev/null || true
  fi
}
ALREADY_RUNNING=0
pgrep -f "flower-superlink.*$FLWR_HOME" >/dev/null 2>&1 && ALREADY_RUNNING=1
trap stop_superlink EXIT

overrides="output-dir='$ROOT/outputs' identity-dir='$IDS'"
for extra in "$@"; do overrides="$overrides $extra"; done
log=$(mktemp)
trap 'rm -f "$log"; stop_superlink' EXIT
flwr run . --stream \
  --federation-config "num-supernodes=$NUM_SUPERNODES" \
  --run-config "$overrides" | tee "$log"

# `flwr run --stream` exits 0 even when the ServerApp fails: ask the SuperLink.
run_id=$(grep -oE 'Successfully started run [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
if [ -z "$run_id" ]; then
  echo "run-local: no run was started (see the output above)" >&2
  exit 1
fi
status=$(flwr ls local --run-id "$run_id" --format json 2>/dev/null |
  python -c 'import json, sys; t = sys.stdin.read(); print(json.loads(t[t.index("{"):])["runs"][0]["status"])' ||
  echo unknown)
if [ "$status" != "finished:completed" ]; then
  echo "run-local: run $run_id ended with status '$status'" >&2
  exit 1
fi
