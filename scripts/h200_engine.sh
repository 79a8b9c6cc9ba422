#!/bin/bash
# Engine data committed under reports/data/h200/ (one H200): the engine with CUDA-graph decode on
# a random-weight Qwen2.5-0.5B (bf16, Triton kernels), each step one `pagebench engine-bench` call.
#
#   scripts/h200_engine.sh OUT_DIR             # on the GPU (equality and breakdown took 2.5 min on an H200; all steps not yet timed there)
#   DEVICE=cpu scripts/h200_engine.sh OUT_DIR  # the same steps at tiny sizes on the CPU (a dry
#                                              # run: tiny model, torch kernel, few tokens)
#   STEPS="throughput peers" scripts/h200_engine.sh OUT_DIR  # a subset of the steps below
# On a copied tree whose .git is stale, export PAGEBENCH_COMMIT=<short hash> first so that
# every row names the commit measured. Greedy equality as pass/fail is the GPU test suite
# (`pytest -m gpu tests/test_decode_graphs.py`); here it is data: rows with agreement rates.
set -euo pipefail
OUT=${1:?usage: scripts/h200_engine.sh OUT_DIR}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}  # may be a command with arguments, e.g. "nice .venv/bin/python"
STEPS=${STEPS:-equality breakdown throughput peers static_compile equal_memory}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
cd "$(dirname "$0")/.."  # the repository root: its pagebench is the one run
# sizes: prompts of 16-400 tokens and 128 new tokens on the GPU; a few tokens on the CPU
if [ "$DEVICE" = cuda ]; then
  MODEL="--preset qwen2.5-0.5b --kernel triton"  # random weights, bf16 unless --dtype
  TINY="--kernel triton"
  EQ="--num-requests 8 --prompt-len 1-300 --max-tokens 16"
  EQ_REAL="--num-requests 4 --prompt-len 16-400 --max-tokens 24 --seed 5"
  PROMPTS="--prompt-len 16-400"; NEW=128; BATCHES=1,16,256; STEP_BATCHES=1,256; PEERS=1,16
  PEER_METHODS=engine,padded_generate,generate_batch
  MEMORY="--batch-sizes 32 --num-requests 128 --prompt-len 16-512 --max-tokens 64"
else
  MODEL="--kernel torch"; TINY="--kernel torch"
  EQ="--num-requests 3 --prompt-len 1-40 --max-tokens 4"
  EQ_REAL="--num-requests 2 --prompt-len 4-40 --max-tokens 4 --seed 5"
  PROMPTS="--prompt-len 4-40"; NEW=4; BATCHES=1,4; STEP_BATCHES=1,4; PEERS=1,2
  PEER_METHODS=engine,padded_generate  # generate_batch takes ~50 s a call on a CPU at any size
  MEMORY="--batch-sizes 2 --num-requests 6 --prompt-len 4-40 --max-tokens 4"
fi
BENCH="$PYTHON -m pagebench engine-bench"
step() { [[ " $STEPS " == *" $1 "* ]]; }
if step equality; then  # tiny model (fp32) at three block sizes, then the real shape in fp32 and bf16
  $BENCH equality $TINY $EQ --block-sizes 1,16,128 --out "$OUT/engine_gpu_equality.csv"
  for dtype in float32 bfloat16; do
    $BENCH equality $MODEL --dtype $dtype $EQ_REAL --block-sizes 16 \
      --out "$OUT/engine_gpu_equality_$dtype.csv"
  done
fi
if step breakdown; then  # one decode step under torch.profiler: wall, GPU busy, host
  $BENCH breakdown $MODEL --batch-sizes $STEP_BATCHES --modes graphs $PROMPTS --max-tokens 20 \
    --out "$OUT/engine_step_breakdown.csv" --profile-out "$OUT/engine_step_profile.txt"
fi
if step throughput; then  # the default (graphs of compiled layers) at every block size; the other modes at block 16
  $BENCH throughput $MODEL --block-sizes 16,1,8,32,128 --batch-sizes $BATCHES --modes graphs --bandwidth \
    $PROMPTS --max-tokens $NEW --repeat 2 --out "$OUT/engine_throughput_vs_batch.csv"
  $BENCH throughput $MODEL --block-sizes 16 --batch-sizes $STEP_BATCHES --modes eager,graphs_uncompiled \
    --bandwidth $PROMPTS --max-tokens $NEW --repeat 2 --out "$OUT/engine_throughput_modes.csv"
fi
if step peers; then  # transformers' generate (padded) and generate_batch on the same requests
  $BENCH compare $MODEL --batch-sizes $PEERS $PROMPTS --max-tokens $NEW --repeat 1 \
    --methods $PEER_METHODS --out "$OUT/engine_vs_transformers_h200.csv"
fi
if step static_compile; then  # generate with a static cache, torch.compile'd: a compile may hang, so bounded
  timeout 180 $BENCH compare $MODEL --batch-sizes 1 $PROMPTS --max-tokens $NEW --repeat 2 \
    --methods generate_static_compile --out "$OUT/engine_vs_transformers_static_compile_h200.csv" \
    || echo "static compile: failed or not finished within 180 s (exit $?)"
fi
if step equal_memory; then  # the engine against padded generate in the KV bytes padded generate reserves
  $BENCH equal-memory $MODEL $MEMORY --out "$OUT/engine_equal_memory_h200.csv"
fi
