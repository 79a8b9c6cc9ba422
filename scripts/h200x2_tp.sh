#!/bin/bash
# Two GPUs of one host, data committed under reports/data/h200x2/: the tensor-parallel engine
# at tp=2 against one GPU (greedy equality, KV blocks per GPU, tokens/s vs batch, the all-reduce
# share of a step, attention per step on one GPU's heads) and the kernel sweep on 1 vs 2 GPUs.
#
#   scripts/h200x2_tp.sh OUT_DIR             # on two GPUs (about 5 min on two H200s)
#   DEVICE=cpu scripts/h200x2_tp.sh OUT_DIR  # the same steps at CPU sizes over gloo (a dry run)
# On a copied tree whose .git is stale, export PAGEBENCH_COMMIT=<short hash> first so that
# every row names the commit measured.
set -euo pipefail
OUT=${1:?usage: scripts/h200x2_tp.sh OUT_DIR}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}  # may be a command with arguments, e.g. "nice .venv/bin/python"
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
cd "$(dirname "$0")/.."  # the repository root: its pagebench is the one run
# NVLink multicast (NVLS) stays off: NCCL's all-reduce and torch's symmetric memory use it
# where the host offers it, and the machines measured here may not
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TP_BENCH="$PYTHON -m torch.distributed.run --standalone --nproc-per-node 2 -m pagebench tp-bench"
if [ "$DEVICE" = cuda ]; then
  EQUALITY="--kernel triton --prompt-len 200"  # prompts of 1..200 tokens, tiny fp32 model
  MODEL="--preset llama-3-8b --kv-memory 16GiB"  # random bf16 weights; KV cache per GPU
  RUN="--batch-sizes 1,16,64,256 --prompt-len 128 --max-tokens 64"
  ATTENTION="--preset llama-3-8b --batch-sizes 1,16,64,256 --context 2048"
  SWEEP="--device cuda --batches 1,4,16,64,256 --contexts 4096 --block-sizes 8,16,32,128 --backends triton,sdpa --repeat 20"
else
  EQUALITY="--kernel torch --prompt-len 40"
  MODEL="--kv-memory 2MiB"  # the tiny random Qwen2 model, bf16
  RUN="--batch-sizes 1,4 --prompt-len 16 --max-tokens 6"
  ATTENTION="--batch-sizes 1,4 --context 64"
  SWEEP="--device cpu --shape tiny=4/2/16 --batches 1,2 --contexts 32 --block-sizes 16 --repeat 1"
  export OMP_NUM_THREADS=1  # as torchrun sets for its workers: steadier on a shared CPU
fi
$TP_BENCH equality --device "$DEVICE" $EQUALITY --out "$OUT/tp_equality.csv"
$TP_BENCH capacity --device "$DEVICE" $MODEL --out "$OUT/tp_capacity.csv"
$TP_BENCH throughput --device "$DEVICE" $MODEL $RUN --out "$OUT/tp_throughput.csv"
$TP_BENCH allreduce --device "$DEVICE" $MODEL $RUN --out "$OUT/tp_allreduce.csv"
# one process: the kernel on one GPU's heads at tp=1 and tp=2, no collective
$PYTHON -m pagebench tp-bench attention --device "$DEVICE" $ATTENTION --out "$OUT/tp_attention.csv"
# one process that starts `torchrun -m pagebench bench` on 1, then 2 GPUs, and times each
$PYTHON -m pagebench tp-bench sweep-wall --bench-args "$SWEEP" --out "$OUT/sweep_wall.csv" \
  --rows-out "$OUT/sweep_rows.csv"
