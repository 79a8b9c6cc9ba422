#!/bin/bash
# Kernel data committed under reports/data/h200/ (one H200): equivalence, the Triton launch
# grids, the decode and prefill sweeps, then the report's acceptance ratios from them.
#
#   scripts/h200_kernels.sh OUT_DIR             # on the GPU
#   DEVICE=cpu scripts/h200_kernels.sh OUT_DIR  # the same steps at CPU sizes (a dry run; no
#                                               # launch grids: they time CUDA graphs)
# On a copied tree whose .git is stale, export PAGEBENCH_COMMIT=<short hash> first so that
# every row names the commit measured.
set -euo pipefail
OUT=${1:?usage: scripts/h200_kernels.sh OUT_DIR}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}  # may be a command with arguments, e.g. "nice .venv/bin/python"
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
cd "$(dirname "$0")/.."  # the repository root: its pagebench and property_tests are the ones run
# equivalence of every backend with the float64 reference, on this device: the property suites
# (on a GPU their CUDA cases run too)
$PYTHON -m pytest property_tests/test_kernel_equivalence.py property_tests/test_kernel_call_sequences.py \
  property_tests/test_kernel_fp8.py -q -x -p no:cacheprovider | tee "$OUT/kernel_properties.txt"
if [ "$DEVICE" = cuda ]; then
  $PYTHON -m pagebench bench --device cuda --tune --out "$OUT/kernels_tuning.csv"
  $PYTHON -m pagebench bench --device cuda --prefill --tune --out "$OUT/kernels_prefill_tuning.csv"
  $PYTHON -m pagebench bench --device cuda --out "$OUT/kernels.csv"
  $PYTHON -m pagebench bench --device cuda --prefill --out "$OUT/kernels_prefill.csv"
else
  $PYTHON -m pagebench bench --device cpu --out "$OUT/kernels.csv"
  $PYTHON -m pagebench bench --device cpu --prefill --out "$OUT/kernels_prefill.csv"
fi
# the acceptance ratios (paged/contiguous, Triton/SDPA, ...) are the report's derived tables
$PYTHON -m pagebench report --quick --results "$OUT" --out "$OUT/report/" --no-progress
