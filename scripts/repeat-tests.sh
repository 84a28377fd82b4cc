#!/usr/bin/env bash
# Measure flakiness: run the chosen tests K times, each time in a fresh pytest process
# (.venv: Python 3.11), and print how often each test passed.
#
# Usage: scripts/repeat-tests.sh K [PYTEST_ARGS...]
#   scripts/repeat-tests.sh 3 -m deployment                  the deployment-engine tests, 3 times
#   scripts/repeat-tests.sh 5 tests/fhe_flower -k malicious  any pytest selection
# env REPEAT_PYTHON overrides the interpreter (default .venv/bin/python; e.g. .venv-py310/bin/python).
#
# Output: one line per repetition (exit code, counts, wall time), then a table
#   passed/K  test-id
# for every test that ran, and a last line "N passed, N failed" over all runs (a test that
# ran but neither passed nor failed, e.g. skipped, is counted apart and listed). The JUnit XML
# of every repetition stays in $REPEAT_DIR (default: a temporary folder, printed).
# Exit 0 only if every test passed in every repetition.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$#" -lt 1 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
K=$1; shift
PY="${REPEAT_PYTHON:-.venv/bin/python}"
DIR="${REPEAT_DIR:-$(mktemp -d)}"
mkdir -p "$DIR"
export TF_CPP_MIN_LOG_LEVEL=2 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
echo "repeat-tests: $K x pytest $* ($PY); JUnit XML in $DIR; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for k in $(seq 1 "$K"); do
  t0=$SECONDS
  "$PY" -m pytest -q -p no:cacheprovider --junitxml="$DIR/run-$k.xml" "$@" >"$DIR/run-$k.log" 2>&1
  rc=$?
  echo "run $k/$K: exit $rc, $(tail -1 "$DIR/run-$k.log" | sed 's/=//g; s/^ *//; s/ *$//'), $((SECONDS - t0)) s"
done
"$PY" - "$DIR" "$K" <<'PY'
import sys, xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

folder, k = Path(sys.argv[1]), int(sys.argv[2])
outcome = defaultdict(lambda: {"passed": 0, "failed": 0, "other": 0})
missing = 0
for i in range(1, k + 1):
    xml = folder / f"run-{i}.xml"
    if not xml.exists():  # pytest did not even start (wiring, interpreter)
        missing += 1
        continue
    for case in ET.parse(xml).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        key = "failed" if tags & {"failure", "error"} else "other" if "skipped" in tags else "passed"
        outcome[name][key] += 1
if not outcome:
    sys.exit("repeat-tests: no test ran")
for name, o in sorted(outcome.items()):
    extra = f" ({o['other']} skipped)" if o["other"] else ""
    print(f"{o['passed']}/{k}  {name}{extra}")
passed = sum(o["passed"] for o in outcome.values())
failed = sum(o["failed"] for o in outcome.values()) + missing
print(f"{passed} passed, {failed} failed")
sys.exit(0 if failed == 0 and all(o["passed"] == k for o in outcome.values()) else 1)
PY
