#!/bin/bash
# Serving under load on one GPU: the data committed under reports/data/<machine>/ as
# serve_bench.csv (latency percentiles and goodput per rate x configuration) and serve_steps.csv
# (every engine step: the step-cost model's training data), then the cost model fitted on them.
#
#   scripts/gpu_serving.sh OUT_DIR             # on the GPU
#   DEVICE=cpu scripts/gpu_serving.sh OUT_DIR  # the same commands at CPU sizes (a dry run)
# Random-weight Qwen2.5-0.5B shape, blocks 16 and 128, bf16 and fp8_e4m3 caches in the same
# memory, prefix caching on and off, the three shipped traces at four rates from light to all at
# once (24 requests per point, outputs cut to 64 tokens: a device allowance of minutes).
# Every configuration's rows are written as soon as it finishes, so a run cut short by
# SERVE_SECONDS keeps what it finished. On a copied tree whose .git is stale, export
# PAGEBENCH_COMMIT=<short hash> first so that every row names the commit measured.
set -euo pipefail
OUT=${1:?usage: scripts/gpu_serving.sh OUT_DIR}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}  # may be a command with arguments, e.g. "nice .venv/bin/python"
SERVE_SECONDS=${SERVE_SECONDS:-600}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
cd "$(dirname "$0")/.."  # the repository root: its pagebench is the one run
if [ "$DEVICE" = cuda ]; then
  # CUDA graphs without torch.compile: eight engines are built, each compile would take minutes
  SIZE="--model qwen2.5-0.5b --num-requests 24 --max-model-len 4096 --max-output-len 64
        --kv-cache-memory 16GiB --max-num-seqs 128 --mode graphs_uncompiled
        --rates 16,32,128,inf --slo-ttft 500 --slo-tpot 25"
else
  SIZE="--num-requests 4 --max-model-len 512 --max-output-len 4 --rates 16,inf
        --slo-ttft 2000 --slo-tpot 200"
fi
timeout "$SERVE_SECONDS" $PYTHON -m pagebench serve-bench --device "$DEVICE" $SIZE \
  --trace azure-code,azure-conv,mooncake-conv --block-sizes 16,128 \
  --kv-cache-dtype auto,fp8_e4m3 --prefix-caching on,off \
  --out "$OUT/serve_bench.csv" --steps-out "$OUT/serve_steps.csv" || echo "serve-bench cut short"
# the step-cost model of each block size x cache dtype, from the steps just measured
$PYTHON -m pagebench step-cost-fit "$OUT/serve_steps.csv" --out "$OUT/step_cost.csv"
