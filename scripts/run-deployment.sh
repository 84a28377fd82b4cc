#!/usr/bin/env bash
# Run the main job with `flwr run .` on a local DEPLOYMENT engine: one SuperLink and
# NUM_SUPERNODES SuperNodes as separate processes on 127.0.0.1, over TLS with a
# throwaway CA, each node with its own signing key (fedeval-identity-key) and the
# roster (flwr_fedeval.testing.deployment). On flwr >= 1.41 the App's FAB is signed with a
# throwaway federation publisher key (Ed25519, deleted at the end) and every SuperNode runs
# only FABs that key signed (--trusted-entities); on flwr 1.30 the FAB goes unsigned (its
# SuperLink takes signed FABs from Flower Hub only). No Ray. Every process is stopped at the
# end; the logs stay in .flwr-deploy/<pid>/logs when the run failed.
# Usage: scripts/run-deployment.sh [NUM_SUPERNODES] [run-config overrides...]
# env RUN_VENV (default .venv) selects the venv (.venv-py310: flwr 1.30 + OpenFHE).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
NUM_SUPERNODES=${1:-5}
shift || true
RUN_VENV=${RUN_VENV:-.venv}
case $RUN_VENV in /*) VENV=$RUN_VENV ;; *) VENV="$ROOT/$RUN_VENV" ;; esac
export PATH="$VENV/bin:$PATH"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 TF_CPP_MIN_LOG_LEVEL=2 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# Node identities: a signing key per node and the roster (scripts/identities.sh).
. scripts/identities.sh
ensure_identities "$NUM_SUPERNODES"

overrides=$(python -m flwr_fedeval.app.preflight --num-supernodes "$NUM_SUPERNODES" \
  "output-dir='$ROOT/outputs' fedeval-roster='$IDS/roster.json'" "$@") || exit 2

WORK="$ROOT/.flwr-deploy/$$"
trap 'rc=$?; [ "$rc" = 0 ] && rm -rf "$WORK"; exit $rc' EXIT
python -m flwr_fedeval.testing.deployment --nodes "$NUM_SUPERNODES" --identity-dir "$IDS" \
  --workdir "$WORK" --app "$ROOT" --run-config "$overrides"
