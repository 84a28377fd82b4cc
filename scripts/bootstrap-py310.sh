#!/usr/bin/env bash
# Create .venv-py310: CPython 3.10 (where the openfhe wheel loads), flwr 1.30 (the
# low end of the supported flwr range) and the project itself, editable, with
# [app,openfhe,dev]. Used by `make run-openfhe` and by the Python 3.10 CI leg
# (scripts/test-openfhe.sh). Idempotent: reinstalls only when pyproject.toml or
# this script changed. pip's cache makes a rebuild take about a minute.
#
# env PY310 overrides the interpreter, PY310_VENV the venv path,
#     PY310_FLWR the flwr requirement (default flwr[simulation]==1.30.*).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${PY310_VENV:-.venv-py310}"
FLWR_REQ="${PY310_FLWR:-flwr[simulation]==1.30.*}"
STAMP="$VENV/.installed-$(cat pyproject.toml "$0" | sha256sum | cut -c1-16)"
[ -f "$STAMP" ] && exit 0

find_python310() {
  local root="${PYENV_ROOT:-$HOME/.pyenv}"
  command -v pyenv >/dev/null 2>&1 && root="$(pyenv root)"
  for candidate in "${PY310:-}" "$root/versions/3.10.13/bin/python" python3.10; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 && \
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  echo "error: CPython 3.10 not found (the openfhe wheel needs it; set PY310=/path/to/python3.10)" >&2
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  PY=$(find_python310)
  echo "[py310] creating $VENV with $("$PY" --version 2>&1)"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
echo "[py310] installing flwr-fedeval[app,openfhe,dev] and $FLWR_REQ into $VENV"
"$VENV/bin/python" -m pip install --quiet -e ".[app,openfhe,dev]" "$FLWR_REQ"
OMP_NUM_THREADS=1 "$VENV/bin/python" -c '
import sys, flwr, openfhe, tenseal, flwr_fedeval.fhe.openfhe_backend
assert sys.version_info[:2] == (3, 10), sys.version
print(f"[py310] Python {sys.version.split()[0]}, flwr {flwr.__version__}, openfhe loads")'
rm -f "$VENV"/.installed-*
touch "$STAMP"
