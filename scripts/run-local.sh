#!/usr/bin/env bash
# Run the main job with `flwr run .` on a local simulation SuperLink that this
# script owns: its own FLWR_HOME (.flwr-home/<pid>/) and free ports, stopped
# again at the end, so two runs at once never share a SuperLink.
# Usage: scripts/run-local.sh [NUM_SUPERNODES] [run-config overrides...]
#   e.g. scripts/run-local.sh 5 "dataset='chest-xray' data-dir='../shared/data/chest-xray'"
# Override lists are merged left to right (a later key=value wins), checked
# before Flower starts (flwr_fedeval.app.preflight: one line per problem).
# env RUN_VENV (default .venv) selects another venv (make run-openfhe: .venv-py310,
# flwr 1.30) and RUN_FLWR_HOME (default .flwr-home) the base of its Flower homes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
NUM_SUPERNODES=${1:-5}
shift || true
export PATH="$ROOT/${RUN_VENV:-.venv}/bin:$PATH"   # RUN_VENV=.venv-py310: the OpenFHE venv
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export TF_CPP_MIN_LOG_LEVEL=2

# Node identities: a signing key per node and the roster (scripts/identities.sh).
. scripts/identities.sh
ensure_identities "$NUM_SUPERNODES"

# Check config, data and partitioning first; prints the merged override list.
overrides=$(python -m flwr_fedeval.app.preflight --num-supernodes "$NUM_SUPERNODES" \
  "output-dir='$ROOT/outputs' identity-dir='$IDS'" "$@") || exit 2

# A SuperLink of our own: FLWR_HOME per run and a free port (flwr >= 1.41 reads
# FLWR_LOCAL_SUPERLINK_HTTP_API_PORT; the SuperLink listens on that port only).
export FLWR_HOME="${RUN_FLWR_HOME:-$ROOT/.flwr-home}/$$"
mkdir -p "$FLWR_HOME"
free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=$(free_port)
FLWR_LOCAL_CONTROL_API_PORT=$(free_port)
export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT FLWR_LOCAL_CONTROL_API_PORT
# flwr 1.30 reads FLWR_LOCAL_CONTROL_API_PORT (its local SuperLink has no other fixed port).
if ! python -c 'import sys; from flwr.cli import constant as c; sys.exit(not (hasattr(c, "LOCAL_SUPERLINK_HTTP_API_PORT") or hasattr(c, "LOCAL_CONTROL_API_PORT")))' 2>/dev/null; then
  # Older flwr: fixed ports, so one local SuperLink per machine.
  if pgrep -f flower-superlink >/dev/null 2>&1; then
    echo "run-local: a flower-superlink already runs on this machine and this flwr uses fixed ports:" \
         "wait for that run to end (pgrep -af flower-superlink)" >&2
    exit 1
  fi
fi

stop_superlink() {
  # The local SuperLink started by `flwr run` keeps running after the run:
  # stop the one of this FLWR_HOME, then what it spawned (superexec, flwr-simulation,
  # which talk to it on its port and can outlive it when a run is interrupted).
  local pids
  pids=$(pgrep -f "flower-superlink.*$FLWR_HOME/" || true)   # FLWR_HOME is per run (flwr 1.30 has no --port)
  [ -n "$pids" ] && kill $pids 2>/dev/null || true
  pids=$(pgrep -f -- "--runtime-api-address 127.0.0.1:$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT( |$)" || true)
  [ -n "$pids" ] && kill $pids 2>/dev/null || true
  rm -f "$log"
}
log=$(mktemp)
# Keep .flwr-home/<pid>/ (the SuperLink's log) only when the run failed.
trap 'rc=$?; stop_superlink; [ "$rc" = 0 ] && rm -rf "$FLWR_HOME"; exit $rc' EXIT

flwr run . --stream \
  --federation-config "num-supernodes=$NUM_SUPERNODES" \
  --run-config "$overrides" | tee "$log"

# `flwr run --stream` exits 0 even when the ServerApp fails: ask the SuperLink (Control API). This
# SuperLink is ours alone (FLWR_HOME per run), so the run it lists is this one.
read -r run_id status < <(flwr ls local --format json 2>/dev/null | python -c '
import json, sys
t = sys.stdin.read()
try:
    runs = json.loads(t[t.index("{"):])["runs"]
except (ValueError, KeyError):
    runs = []
print(*((runs[-1]["run-id"], runs[-1]["status"]) if len(runs) == 1 else ("", "")))' || true)
if [ -z "${run_id:-}" ]; then
  echo "run-local: no run was started (see the output above)" >&2
  exit 1
fi
if [ "$status" != "finished:completed" ]; then
  echo "run-local: run $run_id ended with status '$status'" >&2
  if grep -qE "ALREADY_CONTRIBUTED|BUDGET_EXHAUSTED" "$log"; then  # the reply codes the ledger refuses with
    # The demo's simulated nodes are real nodes to the protocol: their privacy ledgers outlive runs.
    echo "run-local: the demo nodes' privacy ledgers ($IDS/node-*.ledger.sqlite) refused part of this" \
         "run: a node gives one update per global model and spends its DP budget once, across runs." \
         "Rerun from another initial model (RUN_CONFIG=\"seed=7\") or with new demo nodes (make clean)." >&2
  fi
  exit 1
fi
