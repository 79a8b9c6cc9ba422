#!/bin/bash
# The two-GPU runs behind reports/data/h200x2/ as first made (equality, capacity, throughput,
# all-reduce share, attention, sweep wall time): now steps of scripts/gpu2_tp.sh, which also
# measures replicas and the all-reduce bandwidth (docs/parallel.md).
#
#   scripts/h200x2_tp.sh OUT_DIR             # on two GPUs
#   DEVICE=cpu scripts/h200x2_tp.sh OUT_DIR  # the same steps at CPU sizes over gloo (a dry run)
export STEPS=${STEPS:-equality capacity throughput allreduce attention sweep-wall}
exec "$(dirname "$0")/gpu2_tp.sh" "$@"
