#!/bin/bash
# Serving under load on one GPU: the data committed under reports/data/<machine>/ as
# serve_bench.csv (latency percentiles and goodput per rate x configuration), serve_steps.csv
# (every engine step: the step-cost model's training data), step_cost.csv (the model fitted on
# them, one per model x block size x cache dtype) and serve_bench_predicted.csv (the simulator
# with that model on every measured point: the validation).
#
#   scripts/gpu_serving.sh OUT_DIR             # on the GPU (about 6 minutes)
#   DEVICE=cpu scripts/gpu_serving.sh OUT_DIR  # the same commands at CPU sizes (a dry run)
#
# 1. grid: random-weight Qwen2.5-0.5B shape; blocks 16 and 128 x bf16 and fp8_e4m3 caches in the
#    same memory with prefix caching on, and blocks 16 and 128 in bf16 with it off; the three
#    shipped traces at 8, 16, 32 requests/s and all at once (light to past saturation: about
#    25 requests/s for Azure, 16 for Mooncake), 24 requests a point.
# 2. block 1: the same shape, bf16, prefix caching off, Azure conversation, 16 requests a point.
# 3. 8B: Llama-3-8B shape (tp=1, bf16), block 16, Azure conversation at 2, 4, 8 and 16 requests/s,
#    32 requests a point, each rate run twice (--repeats 2), SLO TTFT <= 1 s and TPOT <= 50 ms.
# 4. the step-cost fit on all of their steps and the simulator's prediction of every point.
# Every engine serves each trace once untimed first (serve-bench --warmup-passes), so the first
# rate runs warm. Each part has its own time limit (SERVE_SECONDS scales them) and writes each
# configuration's rows as soon as it finishes, so a part cut short keeps what it finished and
# the others still run. On a copied tree whose .git is stale, export PAGEBENCH_COMMIT=<short
# hash> first so that every row names the commit measured.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_serving.sh OUT_DIR}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}  # may be a command with arguments, e.g. "nice .venv/bin/python"
SCALE=${SERVE_SECONDS:-100}  # percent of each part's time limit
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
rm -f "$OUT"/serve_bench.csv "$OUT"/serve_steps.csv  # parts append to them
cd "$(dirname "$0")/.."  # the repository root: its pagebench is the one run
limit() { echo $(( $1 * SCALE / 100 )); }
COMMON="--device $DEVICE --max-output-len 64 --max-model-len 4096 --append
        --out $OUT/serve_bench.csv --steps-out $OUT/serve_steps.csv"
if [ "$DEVICE" = cuda ]; then
  # CUDA graphs without torch.compile: nine engines are built, each compile would take minutes
  SMALL="--model qwen2.5-0.5b --kv-cache-memory 16GiB --max-num-seqs 128 --mode graphs_uncompiled"
  GRID="$SMALL --num-requests 24 --rates 8,16,32,inf --slo-ttft 500 --slo-tpot 25"
  BLOCK1="$SMALL --num-requests 16 --rates 8,16,32,inf --slo-ttft 500 --slo-tpot 25"
  BIG="--model llama-3-8b --kv-cache-memory 16GiB --max-num-seqs 64 --mode graphs_uncompiled
       --num-requests 32 --rates 2,4,8,16 --repeats 2 --slo-ttft 1000 --slo-tpot 50"
else
  GRID="--num-requests 4 --max-model-len 512 --max-output-len 4 --rates 16,inf
        --slo-ttft 2000 --slo-tpot 200"
  BLOCK1="--num-requests 3 --max-model-len 512 --max-output-len 4 --rates 16,inf"
  BIG="--num-requests 4 --max-model-len 512 --max-output-len 4 --rates 8,inf --repeats 2
       --slo-ttft 2000 --slo-tpot 200"
fi
part() {  # part SECONDS NAME ARGS...: one serve-bench call within its time limit
  local seconds=$1 name=$2
  shift 2
  timeout "$(limit "$seconds")" $PYTHON -m pagebench serve-bench $COMMON "$@" \
    || echo "serve-bench $name: cut short or failed (status $?)" >&2
}
# prefix caching on (4 engines), then off (2): one call each, bf16 first within each
part 160 grid-prefix-on $GRID --trace azure-code,azure-conv,mooncake-conv \
  --block-sizes 16,128 --kv-cache-dtype auto,fp8_e4m3 --prefix-caching on
part 80 grid-prefix-off $GRID --trace azure-code,azure-conv,mooncake-conv \
  --block-sizes 16,128 --kv-cache-dtype auto --prefix-caching off
part 30 block-1 $BLOCK1 --trace azure-conv --block-sizes 1 --prefix-caching off
part 120 llama-3-8b $BIG --trace azure-conv --block-sizes 16
# the step-cost model of each model x block size x cache dtype, from the steps just measured,
# and the simulator's prediction of every measured point with it
$PYTHON -m pagebench step-cost-fit "$OUT/serve_steps.csv" --out "$OUT/step_cost.csv" \
  --validate "$OUT/serve_bench.csv" --predictions-out "$OUT/serve_bench_predicted.csv"
