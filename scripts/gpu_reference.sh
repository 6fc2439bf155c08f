#!/usr/bin/env bash
# gpu_reference.sh DIR: measure one GPU's reference results into DIR in under ten minutes: the
# machine, the peaks and GEMM ceilings, the class M suite in bf16 with --fit eager and compiled
# side by side, each workload beside what the best open implementations reach (anchors), the
# class S suite compiled with CUDA graphs (its steps are launch-bound), hpcdl's step against a
# bare loop in both modes, the GPU tests (pytest -m gpu); then, while the budget lasts, the
# presets' fidelity against the real models, the memory estimate against the caching allocator,
# and the proxy fits verified on the GPU.
# Run it on a quiet machine with one GPU; everything it prints is a measurement. It runs from
# the working tree with the python3 that has torch (PYTHON=...), no install needed.
#
# Each step has its own time limit and ends within the whole budget (BUDGET seconds, default
# 580): a step that hangs or fails is logged and the next one runs; what finished is kept.
# For a smoke test on a CPU: DEVICE=cpu CLASS_M=S DURATION=1 FIT= bash scripts/gpu_reference.sh DIR
# (FIT: the class M runs' --fit fraction, 0.8; empty: no fit)
set -uo pipefail
DIR="${1:?usage: gpu_reference.sh DIR}"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
CLASS_M="${CLASS_M:-M}"
DURATION="${DURATION:-5}"
FIT="${FIT-0.8}"
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
GRAPHS=()
[[ $DEVICE == cuda* ]] && GRAPHS=(--graphs)  # CUDA graphs need a GPU (a CPU smoke test runs without)
step info-probe 60 "${HPCDL[@]}" info --probe
step suite-M 150 "${HPCDL[@]}" run --class "$CLASS_M" --eager precision=bf16 ${FIT:+--fit "$FIT"} --device "$DEVICE" \
  --duration "$DURATION" -o "$DIR/suite-M-bf16"
step suite-M-compiled 200 "${HPCDL[@]}" run --class "$CLASS_M" --compile precision=bf16 ${FIT:+--fit "$FIT"} \
  --device "$DEVICE" --duration "$DURATION" -o "$DIR/suite-M-bf16-compiled"
step anchors 20 "$PY" benchmarks/bench_anchors.py "$DIR/suite-M-bf16" "$DIR/suite-M-bf16-compiled"
cat "$DIR/anchors.txt" >&2 2>/dev/null
step suite-S-graphs 90 "${HPCDL[@]}" run --class S --compile "${GRAPHS[@]}" --device "$DEVICE" \
  --duration "$DURATION" -o "$DIR/suite-S-graphs"
step overhead 60 "$PY" benchmarks/bench_fastpath.py --device "$DEVICE" --parts 2 --only mlp-wide,attention-gpt-mini \
  --rounds 5
step gpu-tests 60 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/
step suite-S 60 "${HPCDL[@]}" run --class S --eager --device "$DEVICE" --duration "$DURATION" -o "$DIR/suite-S"
step fidelity 100 "$PY" benchmarks/bench_fidelity.py --device "$DEVICE" --precision bf16 --rounds 6 \
  --no-baseline
step fidelity-b32x 100 "$PY" benchmarks/bench_fidelity.py --device "$DEVICE" --precision bf16 --rounds 6 \
  --no-baseline --batch-mult 32
step memory 80 "$PY" benchmarks/bench_memory.py --device "$DEVICE" --seeds 2 --fit-mb 2048
step fit 120 "$PY" benchmarks/bench_fit.py --device "$DEVICE" --only resnet50,gpt2 --budget 15 --rounds 6
log "done: $DIR ($(($(date +%s) - START))s)"
