#!/usr/bin/env bash
# The test suite (`make test`, what CI runs through .ci/run), in three legs:
#   1. .venv: Python 3.11, flwr 1.41, every extra: the whole pytest suite
#      (TenSEAL engine);
#   2. .venv-py310: Python 3.10, flwr 1.30, the project with [openfhe]:
#      FHE protocol tests, FHE AUC Flower phases and one `flwr run .` on OpenFHE
#      (scripts/test-openfhe.sh);
#   3. the core wheel without extras in a clean Python 3.12 venv: no TensorFlow,
#      strategies import, one xMK-CKKS round (scripts/test-wheel.sh).
# With arguments, only leg 1 runs: `scripts/run-tests.sh ARGS` = pytest ARGS.
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

leg "py311 flwr-1.41 (pytest $*)" .venv/bin/python -m pytest "$@"
if [ "$#" -eq 0 ]; then
  leg "py310 flwr-1.30 openfhe" scripts/test-openfhe.sh
  leg "core wheel py312" scripts/test-wheel.sh
fi
