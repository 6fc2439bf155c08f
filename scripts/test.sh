#!/usr/bin/env bash
# Set up everything the tests need, lint, type-check, then run every test outside the slow and
# gpu tiers (the README's test command). A later -m replaces the tier's: -m "slow and not gpu"
# runs the slow tier, -m "not gpu" both; CI (.ci/run) runs both; -m gpu needs a GPU.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
PY="${HPCDL_VENV:-.venv}/bin/python"
"$PY" -m ruff check hpcdl tests benchmarks
"$PY" -m mypy
exec "$PY" -m pytest -m "not slow and not gpu" "$@"
