#!/usr/bin/env bash
# asv on a GPU machine with no package index: this working tree's suites against the packages of
# the last N commits that touched pagebench/kernels (H200_PATHS), `-E existing` with
# `--set-commit-hash` per commit, `--launch-method spawn` (CUDA cannot start in a forked child).
#
# What "against a commit" means here: the benchmark suite is always this working tree's (as asv
# itself does for every commit it measures); the pagebench package imported by it is the
# commit's own, extracted with `git archive` and put first on PYTHONPATH.
#
#   here:   scripts/h200_asv.sh prepare         # .h200/: git bundle, commit list, asv wheels
#   there:  bash scripts/h200_asv.sh run        # (device run, carry [".h200"]); results in $OUT
#   here:   scripts/h200_asv.sh collect DIR     # DIR/asv_results/h200/*.json -> asv_results/h200/
#
# Environment: H200_COMMITS (3), H200_PATHS (pagebench/kernels), ASV_MACHINE (h200), H200_BUDGET_S (seconds for all passes, 300),
# H200_PASSES (lines "COMMIT_INDEX full|headline ASV_B_REGEX"; see PASSES below), H200_LAUNCH
# (spawn), H200_PYTHON (python3).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${H200_COMMITS:-3}
# The GPU passes time attention, i.e. pagebench/kernels: commits that only touched the engine
# would measure the same kernels again. H200_PATHS="pagebench/kernels pagebench/engine" widens it.
PATHS=${H200_PATHS:-pagebench/kernels}
MACHINE=${ASV_MACHINE:-h200}
BUDGET_S=${H200_BUDGET_S:-300}
LAUNCH=${H200_LAUNCH:-spawn}
# "commit-index set regex": newest commit's batch-1 sweep first, then the older commits' headline
# points (the history), then the newest commit's throughput sweep, then Flex and block sizes.
if [ -n "${H200_PASSES:-}" ]; then mapfile -t PASSES <<< "$H200_PASSES"; else PASSES=(
  '0 full attention\.Batch1Cuda'
  '1 headline attention\.(Batch1Cuda|ThroughputCuda)'
  '2 headline attention\.(Batch1Cuda|ThroughputCuda)'
  '0 full attention\.ThroughputCuda'
  '0 full attention\.(FlexCuda|BlockSizeCuda)'
); fi
PY=${H200_PYTHON:-python3}

prepare() {
  cd "$ROOT"
  mkdir -p .h200/whl
  git bundle create .h200/repo.bundle main 2>/dev/null
  # shellcheck disable=SC2086
  git log -n "$N" --format=%H main -- $PATHS > .h200/commits.txt
  if ! ls .h200/whl/asv-0.6.6-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
      -d .h200/whl asv==0.6.6 asv_runner==0.3.2 json5 pympler==1.1 importlib-metadata==8.7.0
  fi
  echo "commits (newest first):"; git log --no-walk --format='  %h %s' $(cat .h200/commits.txt)
}

run() {
  cd "$ROOT"
  : "${OUT:?run this on the device machine, where OUT is set}"
  export PYTHONUNBUFFERED=1
  # spawned children: ask the CUDA runtime, not NVML, whether a GPU is there
  export PYTORCH_NVML_BASED_CUDA_CHECK=0
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/asv-site .h200/whl/*.whl
  export PYTHONPATH=/tmp/asv-site
  rm -rf /tmp/pb-repo  # the history, cloned: asv reads the commits' dates from it
  git clone -q --branch main .h200/repo.bundle /tmp/pb-repo
  # the suite outside the checkout, so that only the commit's package is importable
  rm -rf /tmp/pb-suite && mkdir -p /tmp/pb-suite && cp -r benchmarks /tmp/pb-suite/
  "$PY" - "$OUT" <<'EOF'
import json, sys
lines = [l for l in open("asv.conf.json") if not l.lstrip().startswith("//")]
conf = json.loads("".join(lines))
conf.update(repo="/tmp/pb-repo", results_dir=sys.argv[1] + "/asv_results",
            html_dir="/tmp/pb-html", env_dir="/tmp/pb-env", benchmark_dir="benchmarks")
json.dump(conf, open("/tmp/pb-suite/asv.conf.json", "w"), indent=2)
EOF
  cd /tmp/pb-suite
  local gpu cpu
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 \
        || true)
  cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)
  "$PY" -m asv machine --yes --machine "$MACHINE" --arch "$(uname -m)" --num_cpu "$(nproc)" \
    --cpu "$gpu; host $cpu" --os "$(uname -sr)" \
    --ram "$(awk '/MemTotal/ {print $2 "kB"}' /proc/meminfo)" >/dev/null
  "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
  # Passes in priority order; asv adds each pass's results to the commit's file, so a pass cut
  # short by the budget loses only itself. "0" is the newest commit, "1", "2"... older ones.
  mapfile -t commits < "$ROOT/.h200/commits.txt"
  local start=$SECONDS pass idx size bench sha left
  for pass in "${PASSES[@]}"; do
    read -r idx size bench <<< "$pass"
    sha=${commits[$idx]:-}
    [ -n "$sha" ] || continue
    left=$((BUDGET_S - (SECONDS - start)))
    if [ "$left" -lt 20 ]; then echo "== budget spent: skipping ${sha:0:8} -b '$bench'"; continue; fi
    if [ ! -d "/tmp/pkg-$sha" ]; then
      mkdir -p "/tmp/pkg-$sha"
      git -C /tmp/pb-repo archive "$sha" pagebench | tar -x -C "/tmp/pkg-$sha"
    fi
    echo "== ${sha:0:8} ($(git -C /tmp/pb-repo log -1 --format=%s "$sha" | cut -c1-60)):" \
         "-b '$bench', $size set, ${left}s left"
    # asv drops PYTHONPATH in the benchmark processes; ASV_PYTHONPATH becomes theirs
    PAGEBENCH_ASV_GPU=$size ASV_PYTHONPATH="/tmp/pkg-$sha:/tmp/asv-site" \
      timeout "$left" "$PY" -m asv run -E existing --quick --launch-method "$LAUNCH" \
        --set-commit-hash "$sha" --machine "$MACHINE" -b "$bench" --show-stderr \
      || echo "== asv exited with $? for ${sha:0:8}"
  done
  echo "== done in $((SECONDS - start))s"
  ls -R "$OUT/asv_results" || true
}

collect() {
  local src=${1:?give the folder the device run returned (files_at)}
  mkdir -p "$ROOT/asv_results/$MACHINE"
  cp "$src/asv_results/$MACHINE/"*.json "$ROOT/asv_results/$MACHINE/"
  ls "$ROOT/asv_results/$MACHINE"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  collect) shift; collect "$@" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
