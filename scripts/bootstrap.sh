#!/usr/bin/env bash
# Create .venv with Python 3.11 and install the project (editable, with the
# test extras) and flwr 1.42 (the current release: the high end of the supported
# range; the 3.10 leg keeps the low end, 1.30) when it is missing or pyproject.toml
# or this script changed. Idempotent.
# env PY311_FLWR overrides the flwr requirement (default flwr[simulation]==1.42.*).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
FLWR_REQ="${PY311_FLWR:-flwr[simulation]==1.42.*}"
STAMP="$VENV/.installed-$(cat pyproject.toml "$0" | sha256sum | cut -c1-16)"
[ -f "$STAMP" ] && exit 0

find_python311() {
  for candidate in "${PYTHON:-}" python3.11 "$(command -v pyenv >/dev/null 2>&1 && echo "$(pyenv root)/versions/3.11.7/bin/python")" python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 && \
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  echo "error: Python 3.11 not found (set PYTHON=/path/to/python3.11)" >&2
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  PY=$(find_python311)
  echo "Creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
echo "Installing flwr-fedeval and its dependencies into $VENV (first time: a few minutes)"
"$VENV/bin/python" -m pip install --quiet -e ".[dev]" "$FLWR_REQ"
rm -f "$VENV"/.installed-*
touch "$STAMP"
