#!/usr/bin/env bash
# install_horovod.sh: install Horovod 0.28.1 (PyTorch + MPI + Gloo) into a Python environment.
#
# Usage:  bash scripts/install_horovod.sh [PYTHON]
#         PYTHON defaults to .venv/bin/python in the repository root. The environment
#         must already contain torch (Horovod is built against that exact torch).
#
# What it does, and why:
#   * Exits at once if `PYTHON -c 'import horovod.torch'` already works.
#   * On Debian/Ubuntu installs missing build prerequisites with apt-get
#     (openmpi-bin libopenmpi-dev cmake g++ make); set HPCDL_HOROVOD_NO_APT=1 to skip
#     this on clusters where MPI, CMake and a compiler come from environment modules.
#   * Horovod 0.28.1 is the last release and is a source distribution only. Built as-is
#     against torch >= 2.1 it fails twice, so the build here
#       - uses CMake 3.x (/usr/bin/cmake when present) and sets CMAKE_POLICY_VERSION_MINIMUM=3.5,
#         because CMake 4 rejects the bundled gloo's cmake_minimum_required(< 3.5);
#       - compiles through a tiny CXX wrapper (generated in a temp dir) that rewrites the
#         -std=c++11/-std=c++14 Horovod forces into -std=c++17, which torch's headers require.
#     MPI is found by CMake's FindMPI through mpicxx on PATH; no MPICXX setting is needed.
#   * Builds a wheel once (about 7 minutes on 2 cores) and caches it in
#       ${HPCDL_CACHE:-$HOME/.cache/hpcdl}/wheels/<horovod>-<torch>-<python>-<mpi>-<cpu|nccl>/
#     together with the full build log, so later installs into any environment with the
#     same torch/Python/MPI take seconds (pip install --no-deps of the cached wheel).
#   * Verifies the result: hvd.init(), `horovodrun --check-build` (PyTorch, MPI and Gloo
#     must all be listed), then real 2- and 4-rank mpirun jobs and a 2-rank Gloo job that
#     check allreduce and a DistributedOptimizer step (identical parameters on all ranks).
#
# GPU clusters: the default build is CPU only. For NCCL GPU collectives either export
# HOROVOD_GPU_OPERATIONS=NCCL before running this script, or set HPCDL_HOROVOD_GPU=1 on
# a node where nvcc is on PATH (the script then sets HOROVOD_GPU_OPERATIONS=NCCL). torch
# must be a CUDA build; point HOROVOD_NCCL_HOME (or HOROVOD_NCCL_INCLUDE/HOROVOD_NCCL_LIB)
# at NCCL if it is not in a default location. GPU wheels are cached under their own key.
# Note: with a CUDA build of torch, Horovod's CMake requires the CUDA toolkit even for a
# CPU-only build. (The NCCL path has not been tested on a GPU machine.)
#
# Environment knobs:
#   HPCDL_CACHE=DIR          cache root (default $HOME/.cache/hpcdl)
#   HPCDL_HOROVOD_FORCE=1    reinstall even if horovod.torch already imports
#   HPCDL_HOROVOD_TESTS=0    skip the multi-rank mpirun/Gloo tests after installing
#   HPCDL_HOROVOD_NO_APT=1   never call apt-get
#   HPCDL_BUILD_JOBS=N       parallel compile jobs (default: number of cores, at most 8)
#   HPCDL_HOROVOD_GPU=1      build with NCCL if nvcc is found (see above)
#
# Running MPI jobs afterwards (Open MPI): as root export OMPI_ALLOW_RUN_AS_ROOT=1 and
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; use `mpirun --oversubscribe` for more ranks than cores.
set -euo pipefail

HOROVOD_VERSION=0.28.1
SCRIPT_START=$SECONDS

log() { printf '[install_horovod %s +%4ds] %s\n' "$(date +%H:%M:%S)" "$((SECONDS - SCRIPT_START))" "$*"; }
die() { printf '[install_horovod] ERROR: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${1:-$REPO_ROOT/.venv/bin/python}
# Make PYTHON absolute without resolving symlinks: a venv's python is a symlink to the base
# interpreter, and resolving it would silently install into the base environment.
if [[ $PYTHON == */* ]]; then
    [[ -e $PYTHON ]] || die "Python interpreter not found: $PYTHON"
    PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"
else
    PYTHON=$(command -v "$PYTHON") || die "Python interpreter not found on PATH: ${1:-}"
fi
[[ -x $PYTHON ]] || die "not executable: $PYTHON"

# Open MPI refuses to start as root unless told that this is intended. This also covers the
# MPI "singleton" start that hvd.init() does outside mpirun.
if [[ $EUID -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# --- 0. Already installed? --------------------------------------------------------------------
if [[ ${HPCDL_HOROVOD_FORCE:-0} != 1 ]] && "$PYTHON" -c 'import horovod.torch' >/dev/null 2>&1; then
    log "horovod.torch already imports in $PYTHON ($("$PYTHON" -c 'import horovod; print(horovod.__version__)')); nothing to do (HPCDL_HOROVOD_FORCE=1 reinstalls)"
    exit 0
fi
log "installing Horovod $HOROVOD_VERSION into $PYTHON"

"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip (python -m ensurepip?)"
TORCH_INFO=$("$PYTHON" -c 'import torch, sys; print(torch.__version__, torch.version.cuda or "none", "cp%d%d" % sys.version_info[:2])' 2>/dev/null) \
    || die "torch is not importable in $PYTHON; install torch first (Horovod is built against it)"
read -r TORCH_VERSION TORCH_CUDA PY_TAG <<<"$TORCH_INFO"
log "torch $TORCH_VERSION (CUDA: $TORCH_CUDA), Python $PY_TAG"

# --- 1. System prerequisites ------------------------------------------------------------------
APT_PACKAGES=(openmpi-bin libopenmpi-dev cmake g++ make)
if [[ ${HPCDL_HOROVOD_NO_APT:-0} != 1 ]] && command -v dpkg-query >/dev/null 2>&1; then
    missing=()
    for pkg in "${APT_PACKAGES[@]}"; do
        status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
        [[ $status == "install ok installed" ]] || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        log "apt: installing missing packages: ${missing[*]}"
        SUDO=()
        if [[ $EUID -ne 0 ]]; then
            command -v sudo >/dev/null 2>&1 || die "missing packages (${missing[*]}) and not root; install them or set HPCDL_HOROVOD_NO_APT=1"
            SUDO=(sudo)
        fi
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        log "apt: done"
    else
        log "apt: prerequisites already installed (${APT_PACKAGES[*]})"
    fi
fi
for tool in mpirun mpicxx; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found on PATH (install Open MPI, or load your MPI module)"
done
MPI_ID=$(mpirun --version 2>/dev/null || true)
MPI_ID=${MPI_ID%%$'\n'*}  # first line, e.g. "mpirun (Open MPI) 4.1.4"
if [[ $MPI_ID == *"Open MPI"* ]]; then
    MPI_TAG="openmpi${MPI_ID##* }"
    IS_OPENMPI=1
else
    MPI_TAG=$(printf '%s' "$MPI_ID" | tr -c 'A-Za-z0-9.' '_' | cut -c1-24)
    IS_OPENMPI=0
fi

# --- 2. GPU or CPU build ----------------------------------------------------------------------
if [[ -z ${HOROVOD_GPU_OPERATIONS:-} && ${HPCDL_HOROVOD_GPU:-0} == 1 ]]; then
    command -v nvcc >/dev/null 2>&1 || die "HPCDL_HOROVOD_GPU=1 but nvcc is not on PATH (load the CUDA module)"
    export HOROVOD_GPU_OPERATIONS=NCCL
fi
if [[ -n ${HOROVOD_GPU_OPERATIONS:-} ]]; then
    [[ $TORCH_CUDA != none ]] || die "HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS but torch $TORCH_VERSION is a CPU build"
    command -v nvcc >/dev/null 2>&1 || die "HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS but nvcc is not on PATH (load the CUDA module)"
    NVCC_CUDA=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    [[ $NVCC_CUDA == "${TORCH_CUDA%%.*}" ]] || die "nvcc is CUDA $NVCC_CUDA but torch was built with CUDA $TORCH_CUDA: load the matching CUDA module"
    # the architectures of current GPU clusters only (A100, H100/H200, B200): a fraction of the
    # build time of every architecture nvcc knows
    export HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-80,90,100}
    GPU_TAG=${HOROVOD_GPU_OPERATIONS,,}-cuda$TORCH_CUDA
    log "GPU build: HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS, architectures $HOROVOD_BUILD_CUDA_CC_LIST"
else
    GPU_TAG=cpu
fi

# --- 3. Cache layout --------------------------------------------------------------------------
CACHE_ROOT=${HPCDL_CACHE:-$HOME/.cache/hpcdl}
KEY="horovod-$HOROVOD_VERSION-torch-$TORCH_VERSION-$PY_TAG-$MPI_TAG-$GPU_TAG"
WHEEL_DIR="$CACHE_ROOT/wheels/$KEY"
SDIST_DIR="$CACHE_ROOT/sdists"
BUILD_LOG="$WHEEL_DIR/build.log"
mkdir -p "$WHEEL_DIR" "$SDIST_DIR"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/install_horovod.XXXXXX")
BUILD_PID=
cleanup() {
    if [[ -n $BUILD_PID ]] && kill -0 "$BUILD_PID" 2>/dev/null; then kill "$BUILD_PID" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT

find_cached_wheel() { compgen -G "$WHEEL_DIR/horovod-$HOROVOD_VERSION-*.whl" | head -n1 || true; }

# The runtime dependencies of Horovod; with --no-build-isolation its setup.py also needs them
# (setup_requires) plus setuptools/wheel already present in the target environment.
# Plain `pip install` leaves already-satisfied packages (and torch) alone.
log "pip: ensuring Horovod's Python dependencies (cloudpickle psutil pyyaml packaging cffi)"
"$PYTHON" -m pip install -q cloudpickle psutil pyyaml packaging cffi setuptools wheel

# --- 4. Build the wheel once (serialised with a lock so parallel installs don't both build) ---
exec 9>"$WHEEL_DIR/.lock"
flock -n 9 || { log "another install is building this wheel; waiting for it"; flock 9; }
WHEEL=$(find_cached_wheel)
if [[ -n $WHEEL ]]; then
    log "cache hit: $WHEEL"
else
    log "cache miss for $KEY: building the wheel (about 7 min on 2 cores; log: $BUILD_LOG)"
    # Python headers: torch/extension.h pulls in pybind11, which includes Python.h.
    PY_INCLUDE=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    [[ -f $PY_INCLUDE/Python.h ]] || die "Python.h not found in $PY_INCLUDE (install the python3-dev / python3.X-dev package)"

    SDIST=$(compgen -G "$SDIST_DIR/horovod-$HOROVOD_VERSION.tar.gz" || true)
    if [[ -z $SDIST ]]; then
        log "downloading horovod==$HOROVOD_VERSION source distribution"
        "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$SDIST_DIR" "horovod==$HOROVOD_VERSION"
        SDIST="$SDIST_DIR/horovod-$HOROVOD_VERSION.tar.gz"
        [[ -f $SDIST ]] || die "download did not produce $SDIST"
    fi

    # C++17 wrapper: Horovod's CMake sets CMAKE_CXX_STANDARD 14 (and -std=c++11 for gloo);
    # torch >= 2.1 headers stop with "#error C++17 or later compatible compiler is required".
    REAL_CXX=$(command -v "${CXX:-g++}") || die "C++ compiler ${CXX:-g++} not found"
    mkdir -p "$TMP/bin"
    cat >"$TMP/bin/cxx17" <<EOF
#!/usr/bin/env bash
# Generated by install_horovod.sh: rewrite pre-C++17 -std flags for torch's headers.
args=()
for a in "\$@"; do
    case "\$a" in
        -std=c++11|-std=c++14|-std=c++1y|-std=gnu++11|-std=gnu++14|-std=gnu++1y) args+=(-std=c++17) ;;
        *) args+=("\$a") ;;
    esac
done
exec "$REAL_CXX" "\${args[@]}"
EOF
    chmod +x "$TMP/bin/cxx17"

    # CMake 4 refuses the bundled gloo's cmake_minimum_required(VERSION < 3.5): prefer the
    # system CMake 3.x (a `cmake` pip package in an activated venv may be 4.x); the policy
    # variable makes CMake 4 work too and is ignored by 3.x.
    if [[ -x /usr/bin/cmake ]]; then export HOROVOD_CMAKE=/usr/bin/cmake; fi
    export CMAKE_POLICY_VERSION_MINIMUM=3.5

    JOBS=${HPCDL_BUILD_JOBS:-$(nproc)}
    ((JOBS > 8)) && [[ -z ${HPCDL_BUILD_JOBS:-} ]] && JOBS=8
    export CXX="$TMP/bin/cxx17"
    export MAKEFLAGS="-j$JOBS"  # setup.py uses -j8 only when MAKEFLAGS is unset
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
    export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    {
        echo "# install_horovod.sh build of $KEY on $(hostname) at $(date -Is)"
        echo "# python=$PYTHON torch=$TORCH_VERSION mpi='$MPI_ID' cmake=${HOROVOD_CMAKE:-cmake} cxx=$REAL_CXX (via c++17 wrapper) MAKEFLAGS=$MAKEFLAGS"
        env | grep -E '^(HOROVOD_|CMAKE_POLICY)' | sort | sed 's/^/# /'
    } >"$BUILD_LOG"

    # --no-build-isolation: build against the torch in this env (not a fresh one pip would fetch).
    # --no-cache-dir: pip's own wheel cache is keyed by the sdist only, not by torch version.
    "$PYTHON" -m pip wheel -v --no-deps --no-build-isolation --no-cache-dir \
        -w "$TMP/wheelhouse" "$SDIST" >>"$BUILD_LOG" 2>&1 &
    BUILD_PID=$!
    build_start=$SECONDS
    next_report=60
    while kill -0 "$BUILD_PID" 2>/dev/null; do
        sleep 2
        if ((SECONDS - build_start >= next_report)); then
            next_report=$((next_report + 60))
            step=$(grep -oE '\[ *[0-9]+%\] .*' "$BUILD_LOG" | tail -n1 | cut -c1-90 || true)
            log "  still building ($((SECONDS - build_start))s) ${step:-configuring}"
        fi
    done
    if wait "$BUILD_PID"; then rc=0; else rc=$?; fi
    BUILD_PID=
    if ((rc != 0)); then
        # pip ends the log with setup.py-clean noise, so show the first real errors as well.
        {
            echo "----- first error lines of $BUILD_LOG -----"
            grep -n -m 15 -E 'CMake Error|: (fatal )?error:|^ *error:|#error|\*\*\* .*Error [0-9]|Configuring incomplete' "$BUILD_LOG" | cut -c1-300 || true
            echo "----- last 15 lines -----"
            tail -n 15 "$BUILD_LOG"
        } >&2
        die "Horovod build failed (exit $rc) after $((SECONDS - build_start))s; full log: $BUILD_LOG"
    fi
    built=$(compgen -G "$TMP/wheelhouse/horovod-*.whl" | head -n1 || true)
    [[ -n $built ]] || die "build finished but produced no wheel; full log: $BUILD_LOG"
    mv "$built" "$WHEEL_DIR/"
    WHEEL="$WHEEL_DIR/$(basename "$built")"
    log "built $(basename "$WHEEL") in $((SECONDS - build_start))s; cached in $WHEEL_DIR"
fi
flock -u 9

# --- 5. Install ----------------------------------------------------------------------------
# --force-reinstall: the same horovod version may be installed but built against another torch.
"$PYTHON" -m pip install -q --no-deps --force-reinstall "$WHEEL"
log "installed $(basename "$WHEEL")"

# --- 6. Verify -----------------------------------------------------------------------------
size=$("$PYTHON" -c 'import horovod.torch as hvd; hvd.init(); print(hvd.size())' 2>"$TMP/init.err") || {
    cat "$TMP/init.err" >&2; die "import horovod.torch / hvd.init() failed"; }
[[ $size == 1 ]] || die "hvd.init() outside mpirun reported size $size (expected 1)"
log "hvd.init() OK (size $size)"

SCRIPTS_DIR=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
HOROVODRUN="$SCRIPTS_DIR/horovodrun"
[[ -x $HOROVODRUN ]] || die "horovodrun not found at $HOROVODRUN"
"$HOROVODRUN" --check-build >"$TMP/check-build.txt" 2>&1 || { cat "$TMP/check-build.txt" >&2; die "horovodrun --check-build failed"; }
for item in PyTorch MPI Gloo; do
    grep -q "\[X\] $item" "$TMP/check-build.txt" || { cat "$TMP/check-build.txt" >&2; die "horovodrun --check-build does not list $item"; }
done
log "horovodrun --check-build lists PyTorch, MPI and Gloo"
if [[ $GPU_TAG != cpu ]]; then
    # a GPU build that silently lacks NCCL would copy every GPU allreduce through the host
    grep -q "\[X\] NCCL" "$TMP/check-build.txt" || { cat "$TMP/check-build.txt" >&2; die "GPU build without NCCL"; }
    "$PYTHON" -c 'import horovod.torch as hvd; assert hvd.nccl_built(), "nccl_built() is false"' || die "Horovod's NCCL support does not load"
    log "NCCL support built in"
fi

if [[ ${HPCDL_HOROVOD_TESTS:-1} == 0 ]]; then
    log "skipping multi-rank tests (HPCDL_HOROVOD_TESTS=0); done in $((SECONDS - SCRIPT_START))s"
    exit 0
fi

# --- 7. Real multi-rank tests --------------------------------------------------------------
cat >"$TMP/hvd_selftest.py" <<'EOF'
"""Multi-rank Horovod self-test: allreduce and one DistributedOptimizer step."""
import sys

import torch
import horovod.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert size == int(sys.argv[1]), f"expected {sys.argv[1]} ranks, got {size}"

# allreduce: rank r contributes r + 1.
t = torch.full((4,), float(rank + 1))
s = hvd.allreduce(t, op=hvd.Sum, name="sum")
a = hvd.allreduce(t, op=hvd.Average, name="avg")
assert torch.allclose(s, torch.full((4,), size * (size + 1) / 2)), s
assert torch.allclose(a, torch.full((4,), (size + 1) / 2)), a

# DistributedOptimizer: different init and data per rank; broadcast makes the start equal.
torch.manual_seed(1000 + rank)
model = torch.nn.Linear(8, 3)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x, y = torch.randn(16, 8), torch.randn(16, 3)
loss_fn = torch.nn.MSELoss()
params = list(model.parameters())
before = [p.detach().clone() for p in params]
local_grads = torch.autograd.grad(loss_fn(model(x), y), params)  # before the hooks exist
lr = 0.1
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                               named_parameters=model.named_parameters())
hvd.broadcast_optimizer_state(opt, root_rank=0)
opt.zero_grad()
loss_fn(model(x), y).backward()
opt.step()

max_spread = max_err = 0.0
for i, (p, p0, g) in enumerate(zip(params, before, local_grads)):
    gathered = hvd.allgather(p.detach().reshape(1, -1), name=f"gather{i}")
    max_spread = max(max_spread, (gathered - gathered[0]).abs().max().item())
    expected = p0 - lr * hvd.allreduce(g, op=hvd.Average, name=f"grad{i}")
    max_err = max(max_err, (p.detach() - expected).abs().max().item())
    assert not torch.equal(p.detach(), p0), "parameters did not change"
assert max_spread == 0.0, f"parameters differ across ranks by {max_spread}"
assert max_err < 1e-6, f"step does not match the averaged gradient (max error {max_err})"
if rank == 0:
    print(f"hvd-selftest OK: {size} ranks, allreduce sum/avg correct, DistributedOptimizer step "
          f"identical on all ranks and equal to the averaged-gradient SGD step (max err {max_err:.1e})",
          flush=True)
EOF

# Open MPI on one node: --oversubscribe allows more ranks than cores; --bind-to none keeps
# oversubscribed ranks from being pinned to the same core.
MPIRUN=(mpirun)
if ((IS_OPENMPI)); then MPIRUN+=(--oversubscribe --bind-to none); fi

run_test() {  # run_test NAME COMMAND...
    local name=$1 t0=$SECONDS out="$TMP/test.out"
    shift
    if timeout 300 "$@" >"$out" 2>&1; then
        log "$name: $(grep -m1 'hvd-selftest OK' "$out" | sed 's/^.*hvd-selftest/hvd-selftest/') ($((SECONDS - t0))s)"
        if grep -v 'hvd-selftest OK' "$out" | grep -q .; then
            log "$name: extra output:"; grep -v 'hvd-selftest OK' "$out" | sed 's/^/    /'
        fi
    else
        cat "$out" >&2
        die "$name failed"
    fi
}
run_test "mpirun -np 2" "${MPIRUN[@]}" -np 2 "$PYTHON" "$TMP/hvd_selftest.py" 2
run_test "mpirun -np 4" "${MPIRUN[@]}" -np 4 "$PYTHON" "$TMP/hvd_selftest.py" 4
run_test "horovodrun --gloo -np 2" "$HOROVODRUN" --gloo -np 2 -H localhost:2 "$PYTHON" "$TMP/hvd_selftest.py" 2

log "Horovod $HOROVOD_VERSION ready in $PYTHON (total $((SECONDS - SCRIPT_START))s)"
