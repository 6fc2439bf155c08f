#!/usr/bin/env bash
# Set up hpcdl on a fresh Debian 12 machine (as root) or in an existing checkout:
# a virtual environment in .venv with the CPU build of torch 2.13.0 and hpcdl (editable).
#
#   bash scripts/setup.sh          # a local, single-process benchmark
#   bash scripts/setup.sh --mpi    # also Open MPI, mpi4py and Horovod (multi-rank runs)
#   bash scripts/setup.sh --test   # --mpi, plus the test tools (pytest, hypothesis, ruff, mypy, chromium)
#                                  # and the docs' (mkdocs, its Material theme)
#
# Idempotent: a second run only checks. HPCDL_VENV overrides the environment's location;
# HPCDL_TORCH the torch requirement (e.g. a CUDA build on a GPU cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HPCDL_VENV:-.venv}"
TORCH_SPEC="${HPCDL_TORCH:-torch==2.13.0}"
mpi=0
test=0
extras="mpi"
case "${1:-}" in
  --mpi) mpi=1 ;;
  --test) mpi=1; test=1; extras="mpi,test,fidelity,docs" ;;
  "") ;;
  *) echo "usage: bash scripts/setup.sh [--mpi|--test]" >&2; exit 2 ;;
esac

log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

apt_install() {  # apt_install PACKAGE... : only the missing ones, quietly
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

# Debian's Python needs python3-venv for `python3 -m venv`; install it only when missing.
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  apt_install python3-venv python3-dev
fi
[ "$mpi" = 1 ] && apt_install openmpi-bin libopenmpi-dev
# the tests open the HTML report in a real headless browser, a list's CSV in a real spreadsheet
# (LibreOffice Calc, headless), and fit a run with jemalloc preloaded
[ "$test" = 1 ] && apt_install chromium libreoffice-calc-nogui libjemalloc2
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
if [ "$mpi" = 1 ]; then
  log "installing hpcdl[$extras]"
  "$PY" -m pip install -q "${find_links[@]}" -e ".[$extras]"
  # Horovod builds from source once (~7 min on 2 cores), then installs from a cached wheel.
  HPCDL_HOROVOD_TESTS="${HPCDL_HOROVOD_TESTS:-0}" bash scripts/install_horovod.sh "$PY"
else
  log "installing hpcdl"
  "$PY" -m pip install -q "${find_links[@]}" -e .
fi
log "ready: $("$PY" -c 'import torch; print("torch", torch.__version__)'); run $VENV/bin/hpcdl"
