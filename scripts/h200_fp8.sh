#!/bin/bash
# fp8 KV caches against bf16, and the block-table layout as an axis: the data committed under
# reports/data/h200/ (one H200) as kernels_fp8.csv, kernels_layout.csv and fp8_engine.csv, then
# the report's fp8 section (tables and verdicts) built from them.
#
#   scripts/h200_fp8.sh OUT_DIR             # on the GPU
#   DEVICE=cpu scripts/h200_fp8.sh OUT_DIR  # the same commands at CPU sizes (a dry run; Triton
#                                           # interpreted, a tiny model, no CUDA graphs)
# On a copied tree whose .git is stale, export PAGEBENCH_COMMIT=<short hash> first so that
# every row names the commit measured.
set -euo pipefail
OUT=${1:?usage: scripts/h200_fp8.sh OUT_DIR}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}  # may be a command with arguments, e.g. "nice .venv/bin/python"
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
cd "$(dirname "$0")/.."  # the repository root: its pagebench is the one run
if [ "$DEVICE" = cuda ]; then
  # Llama-3-8B attention shape; long contexts and a large batch, blocks 1/16/128
  LAYOUT="--shape llama-3-8b=32/8/128 --points 1x65536,64x4096,256x4096 --block-sizes 1,16,128"
  ENGINE="--preset qwen2.5-0.5b --num-requests 32 --prompt-len 16-512 --max-tokens 32 --kv-cache-memory 4GiB"
else
  LAYOUT="--shape tiny=4/2/16 --points 2x64 --block-sizes 1,16 --repeat 1"
  ENGINE="--num-requests 4 --prompt-len 8-32 --max-tokens 4 --kv-cache-memory 8MiB"
fi
# Triton decode and prefill with a bf16, an e4m3 and (block 16) an e5m2 cache on the same inputs:
# time, fraction of the copy bandwidth, the fp8 output's error (its own grid: the H200 one on CUDA)
$PYTHON -m pagebench bench --device "$DEVICE" --fp8 --out "$OUT/kernels_fp8.csv"
# Triton bf16 decode over contiguous, shuffled and aged block tables, replayed from CUDA graphs
$PYTHON -m pagebench bench --device "$DEVICE" $LAYOUT --backends triton-paged \
  --layouts contiguous,shuffled,aged --cuda-graphs only --out "$OUT/kernels_layout.csv"
# the engine with a bf16 and an fp8_e4m3 KV cache in the same memory (random weights)
$PYTHON -m pagebench engine-bench fp8 --device "$DEVICE" $ENGINE --out "$OUT/fp8_engine.csv"
# the fp8 section's tables and verdicts are the report's, built from these files alone (a report
# left by an earlier run is removed first: its data CSVs would be read as results)
rm -rf "$OUT/report"
$PYTHON -m pagebench report --quick --data-dir "$OUT" --out "$OUT/report/" --no-progress
