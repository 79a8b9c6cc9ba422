#!/usr/bin/env bash
# FlashInfer beside pagebench's kernels, in one GPU call: unpack the bundle, JIT-compile the six
# kernels the measurements use (decode, tensor-core decode and prefill; bf16 and fp8 e4m3) in
# parallel and time each build, then scripts/gpu_flashinfer.py (its CSVs and a short table).
#   BUNDLE=../.fi/flashinfer.tar.xz OUT=$OUT scripts/gpu_flashinfer.sh
# BUNDLE: ../shared/tools/flashinfer_bundle.sh's output. JIT_CACHE (optional): the
# jit_cache.tar.xz an earlier run wrote to OUT (the built .so files, unpacked where FlashInfer
# looks for prebuilt kernels, data/aot/): the builds are then skipped. TOTAL_S: seconds from
# the start after which the measurements stop (default 420). Without a GPU: DEVICE=cpu runs the measurements' tiny
# grid (Triton interpreted) and skips FlashInfer.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu_flashinfer}; mkdir -p "$OUT"
WORK=$(mktemp -d)  # the CSVs and logs, packed into one $OUT/results.tar.gz at the end
START=$EPOCHREALTIME
secs() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
if [ "$DEVICE" = cuda ]; then
  FI=/tmp/fi
  mkdir -p "$FI"
  t0=$EPOCHREALTIME
  tar -xJf "${BUNDLE:?BUNDLE: the FlashInfer bundle (.tar.xz)}" -C "$FI" || exit 2
  echo "bundle unpacked in $(secs "$t0") s"
  export PYTHONPATH="$PYTHONPATH:$FI" FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=${MAX_JOBS:-4}
  if [ -n "${JIT_CACHE:-}" ] && [ -f "$JIT_CACHE" ]; then
    mkdir -p "$FI/flashinfer/data/aot" && tar -xJf "$JIT_CACHE" -C "$FI/flashinfer/data/aot"
    echo "prebuilt kernels: $(ls "$FI/flashinfer/data/aot" | tr '\n' ' ')"
  fi
  $PY -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())" || exit 3
  nvcc --version | tail -1
  jt0=$EPOCHREALTIME
  for job in "decode bf16" "decode e4m3" "decode-tc bf16" "decode-tc e4m3" "prefill bf16" "prefill e4m3"; do
    ( s=$EPOCHREALTIME; $PY scripts/gpu_flashinfer.py jit $job > "$WORK/jit_${job// /_}.log" 2>&1
      echo "jit $job: rc $?, $(secs "$s") s" | tee -a "$WORK/jit_times.txt" ) &
  done
  wait
  echo "JIT builds, all six in parallel: $(secs "$jt0") s wall" | tee -a "$WORK/jit_times.txt"
  tail -n 3 "$WORK"/jit_*.log
  stage=$(mktemp -d)
  find "$FLASHINFER_WORKSPACE_BASE" -name '*.so' 2>/dev/null | while read -r so; do
    name=$(basename "$so" .so); mkdir -p "$stage/$name" && cp "$so" "$stage/$name/"
  done
  [ -n "$(ls "$stage")" ] && tar -C "$stage" -cJf "$OUT/jit_cache.tar.xz" . && ls -l "$OUT/jit_cache.tar.xz"
fi
# the measurements stop at TOTAL_S seconds from this script's start (the JIT builds counted)
DEADLINE_S=$(awk -v t="${TOTAL_S:-420}" -v e="$(secs "$START")" 'BEGIN { print t - e }')
echo "measurements: $DEADLINE_S s"
DEADLINE_S=$DEADLINE_S DEVICE=$DEVICE OUT="$WORK" $PY scripts/gpu_flashinfer.py \
  2>&1 | tee "$WORK/measure.log"
rc=${PIPESTATUS[0]}
tar -C "$WORK" -czf "$OUT/results.tar.gz" .
$PY scripts/flashinfer_table.py "$WORK"
exit "$rc"
