#!/bin/bash
# The GPU half of issue #45's verdicts, in one call: train the shipped tiny model
# (scripts/train_tiny_model.py; its output tarred into OUT_DIR/model.tar at once), then the
# equal-memory comparison with its control (the engine capped at padded generate's
# concurrency; random-weight Qwen2.5-0.5B, bf16, 3 interleaved repeats after a warm-up of each
# method on the same requests). On one H100 the training took 24 s and the comparison 44 s;
# the committed model and reports/data/h100/engine_equal_memory_control.csv came from these
# two commands.
#
#   scripts/gpu_verdicts.sh OUT_DIR [TRAIN_SECONDS]
set -euo pipefail
OUT=${1:?usage: scripts/gpu_verdicts.sh OUT_DIR [TRAIN_SECONDS]}
TRAIN_SECONDS=${2:-70}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
# 16 held-out windows: a Python whose standard library is trimmed (the GPU machine's held 31
# held-out files) has fewer than 32 files of 513 bytes or more
$PYTHON scripts/train_tiny_model.py --out "$OUT/pagebench-tiny-llama" \
  --max-seconds "$TRAIN_SECONDS" --steps "${TRAIN_STEPS:-1500}" --log-every 25 --eval-windows 16
tar -C "$OUT" -cf "$OUT/model.tar" pagebench-tiny-llama && rm -rf "$OUT/pagebench-tiny-llama"
$PYTHON -m pagebench engine-bench equal-memory --preset qwen2.5-0.5b --device cuda \
  --kernel triton --batch-sizes 32 --num-requests "${REQUESTS:-96}" --prompt-len 16-512 \
  --max-tokens 64 --repeat 3 --out "$OUT/engine_equal_memory_control.csv"
