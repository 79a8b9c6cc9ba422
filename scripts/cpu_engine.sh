#!/bin/bash
# CPU engine data committed under reports/data/cpu/ (tiny random Qwen2: 2 layers, hidden 128,
# fp32, torch kernel, 1 thread): the engine against transformers' generation, throughput vs batch
# and block size, copy-on-write, prefix caching, pool size.
#
#   scripts/cpu_engine.sh [OUT_DIR] [REPEAT]      # defaults: reports/data/cpu 3
#   QUICK=1 scripts/cpu_engine.sh /tmp/out 1     # tiny sizes: exercises every command
set -euo pipefail
OUT=${1:-reports/data/cpu}
REPEAT=${2:-3}
PYTHON=${PYTHON:-python3}  # may be a command with arguments, e.g. "nice .venv/bin/python"
cd "$(dirname "$0")/.."  # the repository root: OUT is relative to it, its pagebench is run
mkdir -p "$OUT"
if [ "${QUICK:-0}" = 1 ]; then
  COMPARE="--batch-sizes 4 --prompt-len 8 --max-tokens 4 --methods engine,padded_generate"
  BATCH="--batch-sizes 1,4 --block-sizes 16 --prompt-len 8 --max-tokens 4"
  COW="--prompt-len 32 --max-tokens 4"; PREFIX="--max-tokens 2"; POOL="--max-tokens 4"
else
  # 64 requests, prompts of 16-256 tokens, 64 new tokens each
  COMPARE="--batch-sizes 64 --prompt-len 64 --max-tokens 64 --methods engine,padded_generate,generate_batch"
  BATCH="--batch-sizes 1,4,16,64,256 --block-sizes 8,16,32,128 --prompt-len 64 --max-tokens 32"
  COW="--prompt-len 512 --max-tokens 32"; PREFIX="--max-tokens 16"; POOL="--max-tokens 64"
fi
$PYTHON -m pagebench engine-bench compare $COMPARE --kernel torch --repeat "$REPEAT" --out "$OUT/engine_vs_transformers.csv"
$PYTHON -m pagebench engine-bench throughput $BATCH --kernel torch --repeat "$REPEAT" --out "$OUT/engine_throughput_vs_batch.csv"
$PYTHON -m pagebench engine-bench cow $COW --out "$OUT/engine_cow.csv"
$PYTHON -m pagebench engine-bench prefix $PREFIX --out "$OUT/engine_prefix_cache.csv"
$PYTHON -m pagebench engine-bench pool $POOL --out "$OUT/engine_pool_size.csv"
