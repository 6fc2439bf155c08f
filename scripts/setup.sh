#!/usr/bin/env bash
# Set up hpcdl on a fresh Debian 12 machine (as root) or in an existing checkout:
# a virtual environment in .venv with the CPU build of torch 2.13.0 and hpcdl (editable).
#
#   bash scripts/setup.sh          # runtime only
#   bash scripts/setup.sh --test   # also the test tools (pytest, hypothesis, ruff, mypy)
#
# Idempotent: a second run only checks. HPCDL_VENV overrides the environment's location.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HPCDL_VENV:-.venv}"
TORCH_SPEC="${HPCDL_TORCH:-torch==2.13.0}"
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"

log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# Debian's Python needs python3-venv for `python3 -m venv`; install it only when missing.
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  log "installing python3-venv"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null && apt-get install -y -q python3-venv python3-dev >/dev/null
fi
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
# Install torch first and on its own: a bare "torch" requirement would pull a multi-GB CUDA build.
# /opt/wheels holds the CPU wheel on the project's build machines; elsewhere pip uses PyPI.
find_links=()
[ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
if ! "$PY" -c "import torch" 2>/dev/null; then
  log "installing $TORCH_SPEC"
  "$PY" -m pip install -q "${find_links[@]}" "$TORCH_SPEC"
fi
log "installing hpcdl$extra"
"$PY" -m pip install -q "${find_links[@]}" -e ".$extra"
log "ready: $("$PY" -c 'import torch, hpcdl; print("torch", torch.__version__)'); run $VENV/bin/hpcdl"
