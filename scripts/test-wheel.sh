#!/usr/bin/env bash
# The core-wheel CI leg: build the wheel once, install it WITHOUT extras into a
# clean venv per Python (3.12 and 3.13: the supported versions no other leg
# runs; installed in parallel), show that no TensorFlow/Keras came with it,
# import every strategy and handler, and run one xMK-CKKS secure-aggregation
# round with numpy clients over the serializing in-process grid
# (tests/secagg/test_xmk_fedavg.py against the installed package). The first venv
# has flwr 1.42.0 (the current release) before the wheel is installed: pip must keep it.
# env WHEEL_PYTHONS="/path/python3.12 ..." overrides the interpreters.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PYENV="${PYENV_ROOT:-$HOME/.pyenv}"
command -v pyenv >/dev/null 2>&1 && PYENV="$(pyenv root)"

pythons=()
for candidate in ${WHEEL_PYTHONS:-"$PYENV/versions/3.12.1/bin/python" "$PYENV/versions/3.13.0/bin/python"}; do
  if command -v "$candidate" >/dev/null 2>&1; then pythons+=("$(command -v "$candidate")"); else
    echo "error: $candidate not found (set WHEEL_PYTHONS)" >&2; exit 1; fi
done

echo "== [wheel] build (pip wheel --no-deps)"
"${pythons[0]}" -m pip wheel --quiet --no-deps -w "$WORK/dist" "$ROOT"
ls -l "$WORK"/dist/*.whl | awk '{print "[wheel]", $5, "bytes", $NF}'

KEEP_FLWR=1.42.0
install() {  # install PY DIR [FLWR]: clean venv (+ flwr==FLWR first) + the core wheel, timed
  local py=$1 dir=$2 flwr=${3:-} t0=$SECONDS
  "$py" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --upgrade pip
  if [ -n "$flwr" ]; then "$dir/bin/python" -m pip install --quiet "flwr==$flwr"; fi
  "$dir/bin/python" -m pip install --quiet "$WORK"/dist/*.whl
  echo "$((SECONDS - t0))" > "$dir/.install-seconds"
  "$dir/bin/python" -m pip install --quiet "pytest>=8"
}
pids=()
for i in "${!pythons[@]}"; do
  install "${pythons[$i]}" "$WORK/venv$i" "$([ "$i" = 0 ] && echo "$KEEP_FLWR")" > "$WORK/install$i.log" 2>&1 & pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { grep -v "is ignored" "$WORK/install$i.log" >&2; echo "error: install failed" >&2; exit 1; }
done

cd "$WORK"   # nothing of the source tree on sys.path: the installed wheel is imported
for i in "${!pythons[@]}"; do
  V="$WORK/venv$i/bin/python"
  site=$("$V" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "== [wheel] $("$V" --version 2>&1): pip install <core wheel>: $(cat "$WORK/venv$i/.install-seconds") s" \
       "(parallel), $("$V" -m pip list 2>/dev/null | tail -n +3 | grep -vciE '^(pytest|iniconfig|pluggy|pygments|exceptiongroup|tomli) ') packages," \
       "$(du -sh "$site" | cut -f1) in site-packages (incl. pytest)"
  if [ "$i" = 0 ]; then
    got=$("$V" -c 'import flwr; print(flwr.__version__)')
    [ "$got" = "$KEEP_FLWR" ] || { echo "error: installing the wheel changed flwr $KEEP_FLWR to $got" >&2; exit 1; }
    echo "[wheel] flwr $KEEP_FLWR installed first: kept by pip install <core wheel>"
  fi
  if "$V" -m pip list 2>/dev/null | grep -iE '^(tensorflow|tensorflow-cpu|keras|tf-keras|torch|ray|pyarrow) '; then
    echo "error: the core wheel pulled a framework that belongs to an extra" >&2; exit 1
  fi
  "$V" - <<'PY'
import importlib, importlib.util, sys
import flwr, flwr_fedeval
assert "site-packages" in flwr_fedeval.__file__, flwr_fedeval.__file__
assert importlib.util.find_spec("tensorflow") is None and importlib.util.find_spec("keras") is None
for mod in ("auc_phase", "dp_phases", "fhe_phase", "phases", "shapley_phase", "xmk_fedavg"):
    importlib.import_module(f"flwr_fedeval.strategies.{mod}")
for mod in ("fhe_handlers", "dp_handlers", "shapley_handlers", "xmkckks"):
    importlib.import_module(f"flwr_fedeval.clients.{mod}")
from flwr_fedeval._extras import MissingExtraError
from flwr_fedeval.clients import models
try:
    models.build_mlp(4)
except MissingExtraError as exc:
    assert "[keras]" in str(exc), exc
else:
    sys.exit("error: build_mlp worked without the [keras] extra")
print(f"[wheel] strategies and handlers import on Python {sys.version.split()[0]}, flwr {flwr.__version__}; "
      "no tensorflow/keras; models without [keras]: MissingExtraError names the extra")
PY
  echo "[wheel] one xMK-CKKS round over the in-process grid (numpy clients):"
  "$WORK/venv$i/bin/pytest" -q -p no:cacheprovider --rootdir="$ROOT" -c /dev/null \
    "$ROOT/tests/secagg/test_xmk_fedavg.py" -k "secure_aggregate_equals_plaintext and 3"
done
