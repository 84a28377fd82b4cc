#!/usr/bin/env bash
# Static checks (a leg of scripts/run-tests.sh; `scripts/lint.sh` alone runs it): ruff on
# the package, benchmarks, experiments, tests, examples and docs; mypy strict over the whole
# package (settings in pyproject.toml); the docs site
# (`mkdocs build --strict`: every page, link and API docstring of mkdocs.yml, into a temporary
# folder). Exits non-zero on any finding. Tools from .venv (the [dev] extra pins them).
set -uo pipefail
cd "$(dirname "$0")/.."
rc=0
echo "--- ruff check"
.venv/bin/ruff check flwr_fedeval benchmarks experiments tests examples docs || rc=1
echo "--- mypy"
.venv/bin/mypy || rc=1
echo "--- mkdocs build --strict"
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 PYTHONPATH=$PWD .venv/bin/mkdocs build --strict --quiet --site-dir "$site" || rc=1
rm -rf "$site"
exit $rc
