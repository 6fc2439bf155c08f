#!/usr/bin/env bash
# Set up everything the tests need, lint, type-check, then run every test outside the slow tier
# (the README's test command). A later -m replaces the tier's: -m slow runs the slow tier,
# -m "" everything; CI (.ci/run) runs both.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
PY="${HPCDL_VENV:-.venv}/bin/python"
"$PY" -m ruff check hpcdl tests benchmarks
"$PY" -m mypy
exec "$PY" -m pytest -m "not slow" "$@"
