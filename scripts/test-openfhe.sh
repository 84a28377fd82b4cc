#!/usr/bin/env bash
# Run the FHE backend + protocol tests (tests/fhe/) on the OpenFHE backend.
#
# The openfhe PyPI wheel (1.6.1.0.22.4) loads only on CPython 3.10, so this
# uses a separate venv (.venv-openfhe) built from pyenv's preinstalled 3.10.13
# with numpy, pytest, cryptography, scikit-learn (the reference metric) and
# openfhe only — no flwr, no TensorFlow.
# The package is imported from the source tree (PYTHONPATH): the layers under
# test (flwr_fedeval.fhe, flwr_fedeval.metrics, flwr_fedeval.keyshare) import
# nothing heavy. Idempotent: the venv is created/completed only when missing.
#
# Usage: scripts/test-openfhe.sh [extra pytest args]
#   env OPENFHE_PYTHON=/path/to/python3.10 overrides the interpreter,
#   env OPENFHE_VENV=/path overrides the venv location.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${OPENFHE_VENV:-$ROOT/.venv-openfhe}"
OPENFHE_PIN="openfhe==1.6.1.0.22.4"

find_python() {
    if [[ -n "${OPENFHE_PYTHON:-}" ]]; then echo "$OPENFHE_PYTHON"; return; fi
    local root
    if command -v pyenv >/dev/null 2>&1; then
        root="$(pyenv root)"
    else
        root="${PYENV_ROOT:-$HOME/.pyenv}"
    fi
    if [[ -x "$root/versions/3.10.13/bin/python" ]]; then
        echo "$root/versions/3.10.13/bin/python"; return
    fi
    if command -v python3.10 >/dev/null 2>&1; then command -v python3.10; return; fi
    echo "error: no CPython 3.10 found (set OPENFHE_PYTHON)" >&2
    exit 1
}

venv_ok() {
    [[ -x "$VENV/bin/python" ]] && OMP_NUM_THREADS=1 "$VENV/bin/python" -c \
        "import sys, numpy, pytest, cryptography, sklearn, openfhe; assert sys.version_info[:2] == (3, 10)" \
        >/dev/null 2>&1
}

if ! venv_ok; then
    PY="$(find_python)"
    echo "[test-openfhe] creating $VENV with $("$PY" --version 2>&1)"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        numpy pytest cryptography "scikit-learn<1.9" "$OPENFHE_PIN"
    venv_ok || { echo "error: $VENV is not usable after install" >&2; exit 1; }
fi

export OMP_NUM_THREADS=1
export FHE_BACKEND=openfhe
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/fhe "$@"
