#!/usr/bin/env bash
# The test suite: the main venv (Python 3.11, TenSEAL backend), then the
# OpenFHE backend's protocol tests in their own Python 3.10 venv when the
# project ships that script. pytest's exit code 5 (no test collected) is
# reported and treated as a failure of the suite's wiring.
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=2
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "error: pytest collected no test (exit 5)" >&2
  exit 1
fi
[ $rc -eq 0 ] || exit $rc

if [ -x scripts/test-openfhe.sh ] && [ "$#" -eq 0 ]; then
  scripts/test-openfhe.sh
  rc=$?
  [ $rc -eq 5 ] && { echo "error: OpenFHE suite collected no test" >&2; exit 1; }
  exit $rc
fi
