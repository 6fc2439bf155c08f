#!/usr/bin/env bash
# gpu_reference.sh DIR: measure one GPU's reference results into DIR in under ten minutes: the
# machine, the peaks and GEMM ceilings, the class S suite, the class M suite in bf16 with --fit,
# hpcdl's overhead against a bare loop, the presets' fidelity against the real models (at the
# batches of the CPU table, launch-bound on a GPU, and at 32 times them), the
# memory estimate against the caching allocator, and the proxy fits verified on the GPU.
# Run it on a quiet machine with one GPU; everything it prints is a measurement. It runs from
# the working tree with the python3 that has torch (PYTHON=...), no install needed.
#
# Each step has its own time limit and ends within the whole budget (BUDGET seconds, default
# 580): a step that hangs or fails is logged and the next one runs; what finished is kept.
# For a smoke test on a CPU: DEVICE=cpu CLASS_M=S DURATION=1 bash scripts/gpu_reference.sh DIR
set -uo pipefail
DIR="${1:?usage: gpu_reference.sh DIR}"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
CLASS_M="${CLASS_M:-M}"
DURATION="${DURATION:-6}"
BUDGET="${BUDGET:-580}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$DIR"
START=$(date +%s)
log() { echo "[gpu_reference $(date +%H:%M:%S)] $*" | tee -a "$DIR/steps.log" >&2; }

# step NAME LIMIT CMD...: run CMD for at most LIMIT seconds (less if the budget is nearly
# spent), its output in DIR/NAME.txt; a failure is logged, not fatal
step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((BUDGET - ($(date +%s) - START) - 5))
  ((left < limit)) && limit=$left
  if ((limit < 10)); then
    log "$name: skipped, the budget is spent"
    return
  fi
  log "$name: $* (at most ${limit}s)"
  local t0 rc
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$DIR/$name.txt" 2>&1
  rc=$?
  log "$name: exit $rc after $(($(date +%s) - t0))s"
  if [[ -n "${AFTER_STEP:-}" ]]; then eval "$AFTER_STEP"; fi
}

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  git rev-parse HEAD 2>/dev/null || true
  nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv 2>&1 || true
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda,
    torch.cuda.get_device_name() if torch.cuda.is_available() else "no cuda")'
  "$PY" -c 'import transformers, torchvision, pynvml; print(transformers.__version__, torchvision.__version__)' 2>&1
} >"$DIR/machine.txt" 2>&1

HPCDL=("$PY" -m hpcdl)
step info-probe 90 "${HPCDL[@]}" info --probe
step suite-S 120 "${HPCDL[@]}" run --class S --device "$DEVICE" --duration "$DURATION" -o "$DIR/suite-S"
step suite-M 240 "${HPCDL[@]}" run --class "$CLASS_M" precision=bf16 --fit --device "$DEVICE" \
  --duration "$DURATION" -o "$DIR/suite-M-bf16"
step overhead 70 "$PY" benchmarks/bench_local.py --device "$DEVICE" --parts 1,3 --rounds 5
step fidelity 100 "$PY" benchmarks/bench_fidelity.py --device "$DEVICE" --precision bf16 --rounds 6 \
  --no-baseline
step fidelity-b32x 100 "$PY" benchmarks/bench_fidelity.py --device "$DEVICE" --precision bf16 --rounds 6 \
  --no-baseline --batch-mult 32
step memory 80 "$PY" benchmarks/bench_memory.py --device "$DEVICE" --seeds 2 --fit-mb 2048
step fit 120 "$PY" benchmarks/bench_fit.py --device "$DEVICE" --only resnet50,gpt2 --budget 15 --rounds 6
log "done: $DIR ($(($(date +%s) - START))s)"
