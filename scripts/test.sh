#!/usr/bin/env bash
# Set up everything the tests need, then run the whole test suite (the README's test command).
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
PY="${HPCDL_VENV:-.venv}/bin/python"
"$PY" -m ruff check hpcdl tests benchmarks
"$PY" -m mypy
exec "$PY" -m pytest "$@"
