#!/usr/bin/env bash
# A test lane on another stack than the README's, each in its own environment (.venv-LANE):
#   bash scripts/lane.sh floors [pytest args]  # the lowest releases hpcdl declares (scripts/floors.txt):
#                                              # torch 2.6 (PyPI's CUDA build, ~3.5 GB), numpy 1.24, ...
#   bash scripts/lane.sh mpich  [pytest args]  # Debian's MPICH, mpi4py built against it: the multi-rank tests
# Not yet part of .ci/run (docs/validation/2026-12-07-portability.md says what each lane gave).
set -euo pipefail
cd "$(dirname "$0")/.."
lane=${1:?usage: bash scripts/lane.sh floors|mpich [pytest args]}; shift
VENV=.venv-$lane
log() { printf '[lane %s %s] %s\n' "$lane" "$(date +%H:%M:%S)" "$*"; }
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY=$VENV/bin/python
case "$lane" in
  floors)
    log "installing the floors"
    PIP_CONSTRAINT=$PWD/scripts/floors.txt "$PY" -m pip install -q -c scripts/floors.txt torch -e ".[mpi,test,docs]"
    exec "$PY" -m pytest -m "not slow and not gpu" "$@" ;;
  mpich)
    export DEBIAN_FRONTEND=noninteractive
    dpkg-query -W -f='${Status}' mpich 2>/dev/null | grep -q 'install ok installed' ||
      { apt-get update -q >/dev/null; apt-get install -y -q --no-install-recommends mpich libmpich-dev >/dev/null; }
    # MPICH's launcher first on PATH, with the proxy Hydra looks for beside itself
    mkdir -p "$VENV/mpi"
    for t in mpirun mpiexec mpicc mpicxx; do ln -sf "/usr/bin/$t.mpich" "$VENV/mpi/$t"; done
    ln -sf /usr/bin/hydra_pmi_proxy "$VENV/mpi/hydra_pmi_proxy"
    export PATH=$PWD/$VENV/mpi:$PATH
    find_links=(); [ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
    "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "${find_links[@]}" torch==2.13.0
    "$PY" -c "from mpi4py import MPI; assert 'MPICH' in MPI.Get_library_version()" 2>/dev/null ||
      MPICC=mpicc "$PY" -m pip install -q --no-binary mpi4py --no-cache-dir --force-reinstall mpi4py
    "$PY" -m pip install -q "${find_links[@]}" -e ".[mpi,test]"
    exec "$PY" -m pytest -m "mpi and not slurm and not slow and not gpu" "$@" ;;
  *) echo "unknown lane '$lane': floors or mpich" >&2; exit 2 ;;
esac
