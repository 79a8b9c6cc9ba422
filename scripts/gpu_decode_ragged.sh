#!/usr/bin/env bash
# The decode before/after run (scripts/gpu_decode_ragged.py) in two steps.
#   On this machine, from a checkout:  scripts/gpu_decode_ragged.sh stage [DEST]
#     copies the tracked files to DEST (default /work/main/.gpu_decode) with the old kernel
#     modules of OLD_COMMIT (default 614cada, before the ragged split-KV) in DEST/gpu_old.
#   On the GPU machine (the device tool, carry [".gpu_decode", ".fi"]):
#     cd .gpu_decode && bash scripts/gpu_decode_ragged.sh run
#     unpacks the FlashInfer bundle and its JIT cache from ../.fi when there, then measures;
#     the CSV lands in $OUT/decode_ragged.csv and a table is printed last.
set -euo pipefail
OLD_COMMIT=${OLD_COMMIT:-614cada}
case "${1:-}" in
  stage)
    dest=${2:-/work/main/.gpu_decode}
    rm -rf "$dest" && mkdir -p "$dest/gpu_old"
    git ls-files -z | xargs -0 cp --parents -t "$dest"
    git show "$OLD_COMMIT:pagebench/kernels/triton_decode.py" > "$dest/gpu_old/old_triton_decode.py"
    git show "$OLD_COMMIT:pagebench/kernels/cuda_fp8_decode.py" > "$dest/gpu_old/old_cuda_fp8_decode.py"
    echo "$(git rev-parse --short HEAD)" > "$dest/gpu_old/NEW_COMMIT"
    echo "staged $(git rev-parse --short HEAD) (old: $OLD_COMMIT) in $dest";;
  run)
    export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    if [ -f ../.fi/flashinfer.tar.xz ]; then
      mkdir -p /tmp/fi/flashinfer/data/aot
      tar -xJf ../.fi/flashinfer.tar.xz -C /tmp/fi
      [ -f ../.fi/jit_cache.tar.xz ] && tar -xJf ../.fi/jit_cache.tar.xz -C /tmp/fi/flashinfer/data/aot
      export PYTHONPATH="$PYTHONPATH:/tmp/fi" FLASHINFER_WORKSPACE_BASE=/tmp/fiws
    fi
    OLD_DIR="$PWD/gpu_old" OLD_COMMIT=$OLD_COMMIT PAGEBENCH_COMMIT=$(cat gpu_old/NEW_COMMIT) \
      DEADLINE_S=${DEADLINE_S:-170} OUT=${OUT:-/tmp/gpu_decode_ragged} \
      python3 scripts/gpu_decode_ragged.py;;
  *) echo "usage: $0 stage [DEST] | run" >&2; exit 2;;
esac
