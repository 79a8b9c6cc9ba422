#!/bin/bash
# Two GPUs of one host (nvidia-h100-x2 or nvidia-h200-x2): every run issue #47's "Done when"
# needs, as CSVs in OUT_DIR, to commit under reports/data/<machine>/ (docs/parallel.md).
#
#   scripts/gpu2_tp.sh OUT_DIR                      # the default STEPS, one device call
#   STEPS="capacity attention" scripts/gpu2_tp.sh OUT_DIR   # any steps, by name
#   DEVICE=cpu scripts/gpu2_tp.sh OUT_DIR           # the same steps at CPU sizes over gloo
#   EXTRA=--compile STEPS="throughput replicas" scripts/gpu2_tp.sh OUT_DIR2  # compiled layers
#
# Steps (STEPS, in this order; default: gpu-tests equality throughput replicas bandwidth):
#   gpu-tests   the one-GPU tests of the captured-collective path (pytest -m gpu), log only
#   equality    greedy tokens at tp=2 (CUDA graphs) against one GPU: tiny and 0.5B shape, fp32
#   throughput  tokens/s vs batch, per model: tp=1 on rank 0 alone, then tp=2; eager and graphs
#   replicas    tokens/s vs batch of two independent tp=1 engines (one process and GPU each)
#   bandwidth   all-reduce time and bus bandwidth at decode-step sizes, per model's hidden size
#   allreduce   the all-reduce share of a tp=2 eager step (8B)
#   capacity    KV blocks per GPU at tp=1 and tp=2 (8B)
#   attention   the paged decode kernel on one GPU's heads at tp=1 and 2 (one process)
#   serve       serve-bench of the 8B shape on one engine and on two replicas at two rates
#               (tp_serve_replicas*.csv: serve_bench rows the report does not read yet)
#   sweep-wall  the kernel sweep's wall time on 1 and 2 GPUs
# Each step's seconds are appended to OUT_DIR/timings.txt. On a copied tree whose .git is
# stale, export PAGEBENCH_COMMIT=<short hash> first so that every row names the commit.
set -euo pipefail
OUT=${1:?usage: scripts/gpu2_tp.sh OUT_DIR}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}  # may be a command with arguments, e.g. "nice .venv/bin/python"
STEPS=${STEPS:-gpu-tests equality throughput replicas bandwidth}
EXTRA=${EXTRA:-}  # more tp-bench options for throughput and replicas, e.g. --compile
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
cd "$(dirname "$0")/.."  # the repository root: its pagebench is the one run
# NVLink multicast (NVLS) stays off: NCCL's all-reduce and torch's symmetric memory use it
# where the host offers it, and the machines measured here may not
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TORCHRUN="$PYTHON -m torch.distributed.run --standalone --nproc-per-node 2 -m pagebench tp-bench"
ONE="$PYTHON -m pagebench tp-bench"
if [ "$DEVICE" = cuda ]; then
  MODELS="llama-3-8b qwen2.5-0.5b"
  EQUALITY="--kernel triton --prompt-len 200"  # prompts of 1..200 tokens, fp32
  KV="--kv-memory 16GiB"  # KV cache per GPU
  RUN="--batch-sizes 1,16,64,256 --prompt-len 128 --max-tokens 64"
  BW="--batch-sizes 1,4,16,64,256,1024 --repeat 10"
  ATTENTION="--preset llama-3-8b --batch-sizes 1,16,64,256 --context 2048"
  SERVE="--model llama-3-8b --num-requests 200 --rates 4,16 --max-model-len 2048 --max-output-len 128 --kv-cache-memory 16GiB"
  SWEEP="--device cuda --batches 1,4,16,64,256 --contexts 4096 --block-sizes 8,16,32,128 --backends triton,sdpa --repeat 20"
else
  MODELS="tiny"
  EQUALITY="--kernel torch --prompt-len 40"
  KV="--kv-memory 2MiB"
  RUN="--batch-sizes 1,4 --prompt-len 16 --max-tokens 6"
  BW="--batch-sizes 1,4,16 --repeat 3"
  ATTENTION="--batch-sizes 1,4 --context 64"
  SERVE="--model tiny --num-requests 8 --rates 20 --max-model-len 128 --max-output-len 8"
  SWEEP="--device cpu --shape tiny=4/2/16 --batches 1,2 --contexts 32 --block-sizes 16 --repeat 1"
  export OMP_NUM_THREADS=1  # as torchrun sets for its workers: steadier on a shared CPU
fi
preset() { [ "$1" = tiny ] || echo "--preset $1"; }

step() {  # step NAME COMMAND...: run it if STEPS names it, and log its seconds
  local name=$1 start=$SECONDS
  shift
  case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
  echo "== $name"
  "$@"
  echo "$name $((SECONDS - start)) s" | tee -a "$OUT/timings.txt"
}

gpu_tests() {
  [ "$DEVICE" = cuda ] || return 0
  CUDA_VISIBLE_DEVICES=0 $PYTHON -m pytest -q -m gpu tests/test_parallel.py \
    tests/test_decode_graphs.py 2>&1 | tee "$OUT/gpu_tests.txt" ||
    echo "gpu-tests FAILED (gpu_tests.txt); the measurements go on" | tee -a "$OUT/timings.txt"
}

equality() {
  $TORCHRUN equality --device "$DEVICE" $EQUALITY --out "$OUT/tp_equality.csv"
  if [ "$DEVICE" = cuda ]; then
    $TORCHRUN equality --device cuda --preset qwen2.5-0.5b --kernel triton --prompt-len 200 \
      --out "$OUT/tp_equality_qwen2.5-0.5b.csv"
  fi
}

throughput() {
  for m in $MODELS; do
    $TORCHRUN throughput --device "$DEVICE" $(preset $m) $KV $RUN $EXTRA \
      --out "$OUT/tp_throughput_$m.csv"
  done
}

replicas() {
  for m in $MODELS; do
    $ONE replicas --device "$DEVICE" $(preset $m) $KV $RUN $EXTRA --replicas 2 \
      --out "$OUT/tp_throughput_replicas_$m.csv"
  done
}

bandwidth() {
  for m in $MODELS; do
    $TORCHRUN allreduce-bw --device "$DEVICE" $(preset $m) $BW --out "$OUT/tp_allreduce_bw_$m.csv"
  done
}

serve() {
  for n in 1 2; do
    $PYTHON -m pagebench serve-bench --device "$DEVICE" $SERVE --replicas $n \
      --slo-ttft 2000 --slo-tpot 100 --out "$OUT/tp_serve_replicas$n.csv"
  done
}

MODEL8B="--preset llama-3-8b"
[ "$DEVICE" = cuda ] || MODEL8B=""
step gpu-tests gpu_tests
step equality equality
step throughput throughput
step replicas replicas
step bandwidth bandwidth
step allreduce $TORCHRUN allreduce --device "$DEVICE" $MODEL8B $KV $RUN --out "$OUT/tp_allreduce.csv"
step capacity $TORCHRUN capacity --device "$DEVICE" $MODEL8B $KV --out "$OUT/tp_capacity.csv"
step attention $ONE attention --device "$DEVICE" $ATTENTION --out "$OUT/tp_attention.csv"
step serve serve
step sweep-wall $ONE sweep-wall --bench-args "$SWEEP" --out "$OUT/sweep_wall.csv" \
  --rows-out "$OUT/sweep_rows.csv"
