#!/usr/bin/env bash
# The test suite (`make test`, what CI runs through .ci/run), in three legs and a lint leg:
#   1. .venv: Python 3.11, flwr 1.42, every extra: the whole pytest suite
#      (TenSEAL engine); the deployment-engine tests (-m deployment) run in the
#      background from the start, beside all legs, and are reported last;
#   2. .venv-py310: Python 3.10, flwr 1.30, the project with [openfhe]:
#      FHE protocol tests, FHE AUC Flower phases and one `flwr run .` on OpenFHE
#      (scripts/test-openfhe.sh);
#   lint: ruff, mypy and mkdocs build --strict from .venv (scripts/lint.sh);
#   3. the core wheel without extras in a clean Python 3.12 venv: no TensorFlow,
#      strategies import, one xMK-CKKS round (scripts/test-wheel.sh).
# Lint, leg 2 and leg 3 run one after the other in the background from the start (nice 10)
# and are reported after leg 1.
# With arguments, only leg 1 runs: `scripts/run-tests.sh ARGS` = pytest ARGS (deployment
# tests included unless ARGS deselect them).
# pytest's exit code 5 (no test collected) is treated as a failure of the wiring.
# Each leg prints its wall time.
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=2
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

leg() {  # leg NAME CMD...: run, time, stop the suite on failure
  local name=$1; shift
  local t0=$SECONDS
  echo "===== leg: $name"
  "$@"
  local rc=$?
  echo "===== leg: $name: exit $rc, $((SECONDS - t0)) s"
  if [ $rc -eq 5 ]; then echo "error: pytest collected no test (exit 5)" >&2; exit 1; fi
  [ $rc -eq 0 ] || exit $rc
}

FLWR_311=$(.venv/bin/python -c 'import flwr; print(flwr.__version__)')
if [ "$#" -gt 0 ]; then
  leg "py311 flwr-$FLWR_311 (pytest $*)" .venv/bin/python -m pytest "$@"
  exit 0
fi
# The deployment-engine tests (tests/deployment: real SuperLink/SuperNode processes) spend
# most of their time waiting (Flower's 60 s heartbeat before a crashed node is dropped, the
# processes' start-up): they run in the background, beside the other legs, in three pytest
# processes, each with its own log. The files are dealt longest first, each to the group with
# the least expected time so far (dep_cost: seconds each took in a full `make test`, the two
# quickstart examples scaled to the one round they now run; relative only; a file not listed
# counts 400 s).
declare -A dep_cost=(
  [test_deployment_ledger.py]=630 [test_deployment_engine.py]=610 [test_deployment_resume.py]=545
  [test_example_advanced_pytorch.py]=500 [test_deployment_faults.py]=475
  [test_example_quickstart_pytorch.py]=330 [test_fab_trust.py]=160 [test_example_quickstart_tensorflow.py]=125
)
dep_files=() dep_groups=("" "" "") dep_load=(0 0 0)
while read -r _ f; do dep_files+=("$f"); done < <(
  for f in tests/deployment/test_*.py; do echo "${dep_cost[$(basename "$f")]:-400} $f"; done | sort -k1,1nr -k2)
for f in "${dep_files[@]}"; do
  g=0; for k in 1 2; do [ "${dep_load[$k]}" -lt "${dep_load[$g]}" ] && g=$k; done
  dep_groups[$g]+=" $f"; dep_load[$g]=$((dep_load[$g] + ${dep_cost[$(basename "$f")]:-400}))
done
dep_logs=() dep_pids=() rest_pid="" rest_log=""
stop_dep() {  # a leg failed: stop the deployment tests (SIGTERM: their fixture stops every process)
  local pid
  for pid in "${dep_pids[@]}"; do kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
  if [ "${#dep_pids[@]}" -gt 0 ]; then local f; for f in "${dep_logs[@]}"; do tail -30 "$f"; done; fi
  # the other legs are let finish (the py310 leg's local deployment stops its processes itself)
  if [ -n "$rest_pid" ]; then wait "$rest_pid" 2>/dev/null; tail -30 "$rest_log"; fi
  rm -f "${dep_logs[@]}" "$rest_log"
}
trap stop_dep EXIT
dep_t0=$SECONDS
for g in "${dep_groups[@]}"; do
  [ -n "$g" ] || continue
  log=$(mktemp); dep_logs+=("$log")
  # shellcheck disable=SC2086  # $g: the group's file list
  .venv/bin/python -m pytest -m deployment -p no:cacheprovider --durations=0 $g >"$log" 2>&1 &
  dep_pids+=($!)
done
# Lint, the py310/OpenFHE leg and the core wheel leg run one after the other in the background from the
# start too, at a lower priority (nice 10): leg 1 is one pytest process (one core) and the deployment
# tests wait much of the time, so they fill the cores left idle rather than run after leg 1.
rest_log=$(mktemp)
(
  renice -n 10 -p "$BASHPID" >/dev/null
  leg "lint (ruff, mypy)" scripts/lint.sh
  leg "py310 flwr-1.30 openfhe" scripts/test-openfhe.sh
  leg "core wheel py312" scripts/test-wheel.sh
) >"$rest_log" 2>&1 &
rest_pid=$!
leg "py311 flwr-$FLWR_311 (pytest -m 'not deployment')" .venv/bin/python -m pytest -m "not deployment" --durations=15
echo "===== lint, py310 and core wheel legs (in the background since the start, nice 10):"
wait "$rest_pid"; r=$?
cat "$rest_log"
rest_pid=""
[ $r -eq 0 ] || exit $r
echo "===== leg: py311 flwr-$FLWR_311 deployment engine (pytest -m deployment, ${#dep_pids[@]} processes in the background since the start)"
rc=0
for k in "${!dep_pids[@]}"; do
  wait "${dep_pids[$k]}"; r=$?
  cat "${dep_logs[$k]}"
  [ $r -eq 5 ] && { echo "error: pytest collected no deployment test in group $k (exit 5)" >&2; r=1; }
  [ $r -eq 0 ] || rc=$r
done
dep_pids=()
echo "===== leg: py311 flwr-$FLWR_311 deployment engine: exit $rc, $((SECONDS - dep_t0)) s since the start"
exit $rc
