#!/usr/bin/env bash
# The Python 3.10 CI leg: the project installed with [openfhe] and flwr 1.30
# (.venv-py310, scripts/bootstrap-py310.sh), the OpenFHE CKKS engine.
#   (a) the FHE protocol tests (tests/fhe) on OpenFHE;
#   (b) the FHE AUC Flower-phase tests over the serializing in-process grid
#       (tests/fhe_flower without the slow in-process main-job runs, which
#       (c) replaces by the real thing: both protocols, fhe-backend "openfhe");
#   (c) one real `flwr run .` of the main job (malicious protocol, OpenFHE) on a
#       local deployment engine (scripts/run-deployment.sh: SuperLink + 3 SuperNodes,
#       TLS, no Ray) whose FINAL line must agree with the pooled roc_auc_score to 1e-3.
# Usage: scripts/test-openfhe.sh            the whole leg
#        scripts/test-openfhe.sh ARGS...    pytest ARGS in that venv, on OpenFHE
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
scripts/bootstrap-py310.sh || exit 1
VENV="${PY310_VENV:-.venv-py310}"
export OMP_NUM_THREADS=1 FHE_BACKEND=openfhe TF_CPP_MIN_LOG_LEVEL=2
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

pytest_leg() {
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
  local rc=$?
  [ $rc -eq 5 ] && { echo "error: pytest collected no test in the 3.10 leg ($*)" >&2; return 1; }
  return $rc
}

if [ "$#" -gt 0 ]; then pytest_leg "$@"; exit $?; fi

echo "== [py310/openfhe] (a) FHE protocol tests; flwr-1.30 shims and the grid (xMK-CKKS over it)"
pytest_leg tests/fhe tests/platform tests/secagg || exit 1
echo "== [py310/openfhe] (b) FHE AUC Flower phases over the serializing grid"
pytest_leg tests/fhe_flower -m "not slow" || exit 1  # the main job itself: (c)

echo "== [py310/openfhe] (c) flwr run . on a local deployment engine (SuperLink + 3 SuperNodes, TLS; fhe-auc malicious, fhe-backend openfhe)"
# The deployment engine, not the simulation: no Ray (whose 30 s start-up limit failed on a loaded CI host).
# Throwaway node identities: the nodes' privacy ledgers (beside their keys) would refuse this leg's
# evaluation of the same global model on a second `make test` of the same checkout.
log=$(mktemp) ids_root=$(mktemp -d)
trap 'rm -rf "$log" "$ids_root"' EXIT
FEDEVAL_IDS_ROOT="$ids_root" RUN_VENV="$VENV" scripts/run-deployment.sh 3 \
  "auc-method='fhe' fhe-backend='openfhe' fhe-auc='malicious' num-server-rounds=1" \
  >"$log" 2>&1
rc=$?
grep -E "FINAL|ERROR|local deployment" "$log" | sed 's/\x1b\[[0-9;]*m//g' | sort -u
[ $rc -eq 0 ] || { tail -60 "$log"; echo "error: flwr run on the local deployment engine failed (exit $rc)" >&2; exit 1; }
"$VENV/bin/python" - "$log" <<'PY'
import re, sys
text = re.sub(r"\x1b\[[0-9;]*m", "", open(sys.argv[1]).read())
hits = re.findall(r"FINAL federated AUC \((fhe\[malicious, openfhe\]), N=\d+, \d+ clients\): "
                  r"([0-9.]+) \|[^\n]*?pooled roc_auc_score: ([0-9.]+)", text)
if not hits:
    sys.exit("error: no 'FINAL federated AUC (fhe[malicious, openfhe], ...)' line in the flwr run output")
_, auc, ref = hits[-1]
diff = abs(float(auc) - float(ref))
print(f"[py310/openfhe] flwr run: federated AUC {auc} vs pooled roc_auc_score {ref}: |diff| {diff:.2e}")
sys.exit(0 if diff <= 1e-3 else "error: |diff| > 1e-3")
PY
