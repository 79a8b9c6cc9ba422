# pagebench: `make setup` creates .venv, `make report` runs the main job, `make test` lints
# (ruff, rules in pyproject.toml) and runs the whole test suite (CI; on a GPU machine the GPU
# tests after it), `make test-fast` every test not marked `slow`. Every target creates .venv on
# first use and installs the project into it.

PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.pagebench-installed
# torch is installed first, pinned. From plain PyPI the pin is the CUDA build (several GB, also on
# a CPU-only machine); for the CPU-only build point pip at its index, e.g.
#   make setup TORCH_PIP_ARGS="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP_ARGS ?= torch==2.13.0
REPORT_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup report test test-fast test-gpu bench bench-compare asv-quick clean-venv browser-deps

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_PIP_ARGS)
	$(PY) -m pip install --quiet -e ".[all]"
	touch $(STAMP)

setup: $(STAMP)

report: $(STAMP)
	$(PY) -m pagebench report $(REPORT_ARGS)

# Headless Chromium for the report's browser test (Debian's package; needs root or sudo).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

# Two tiers. The CPU tier (every test; what CI runs) hides any GPU, so that Triton runs
# interpreted on CPU tensors as on a machine without one. Where a CUDA device is present the GPU
# tier (`test-gpu`: the tests marked `gpu`, Triton compiled) runs after it.
PROFILE  := HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci}
CPU_TIER := CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 $(PROFILE)
HAS_CUDA := $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null

test: $(STAMP) browser-deps
	$(VENV)/bin/ruff check .
	$(CPU_TIER) $(PY) -m pytest $(PYTEST_ARGS)
	@if $(HAS_CUDA); then $(MAKE) --no-print-directory test-gpu; \
	  else echo "no CUDA device here: the GPU tier (make test-gpu) was not run"; fi

# The fast tier: everything not marked `slow` (more than a few seconds on 2 cores), the 25 slowest
# listed so that a test that grew slow shows.
test-fast: $(STAMP) browser-deps
	$(VENV)/bin/ruff check .
	$(CPU_TIER) $(PY) -m pytest -m "not slow" --durations=25 $(PYTEST_ARGS)

test-gpu: $(STAMP)
	$(PROFILE) $(PY) -m pytest -m gpu $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)

# ---- benchmarks ---------------------------------------------------------------------------
# `make bench`: time the pytest-benchmark micro-benchmarks, JSON for `pagebench report` (under
# reports/bench/, ignored; BENCH_JSON=reports/data/cpu/pytest-benchmark.json updates the committed
# data). `make bench-compare BASE=main [HEAD_REV=HEAD] [THRESHOLD=0.2]`: the regression gate,
# exit 1 on a regression (its defaults are the command's: `pagebench bench-compare --help`).
# `make asv-quick`: asv over the last two commits (HEAD~2..HEAD), each built offline into .asv/env.
BENCH_JSON ?= reports/bench/pytest-benchmark.json
BASE ?= HEAD~1
HEAD_REV ?= HEAD
THRESHOLD ?=
ASV := $(VENV)/bin/asv
# results land in asv_results/$(ASV_MACHINE)/: git-ignored unless that machine's are committed
ASV_MACHINE ?= $(shell hostname)
ASV_RANGE ?= HEAD~2..HEAD
# asv installs asv_runner and pympler into each environment: .asv/wheelhouse has them offline
ASV_ENV = PIP_FIND_LINKS="$${PIP_FIND_LINKS:-} $(CURDIR)/.asv/wheelhouse"

bench: $(STAMP)
	mkdir -p $(dir $(BENCH_JSON))
	$(PY) -m pytest tests/benchmarks --benchmark-enable --benchmark-json=$(BENCH_JSON) -q

bench-compare: $(STAMP)
	$(PY) -m pagebench bench-compare --base $(BASE) --head $(HEAD_REV) \
	  $(if $(THRESHOLD),--threshold $(THRESHOLD))

.asv/wheelhouse: $(STAMP)
	$(PY) scripts/asv_wheelhouse.py --dest .asv/wheelhouse

asv-quick: $(STAMP) .asv/wheelhouse
	@# asv 0.6.6 drops --machine when it equals the host name and then fails (KeyError 'machine')
	@# if any other field was given: under the host name, take all of asv's own defaults
	if [ "$(ASV_MACHINE)" = "$$(hostname)" ]; then $(ASV) machine --yes; else \
	  $(ASV) machine --yes --machine $(ASV_MACHINE) --os "$$(uname -sr)" --arch "$$(uname -m)" \
	    --num_cpu "$$(nproc)" --cpu "$$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)" \
	    --ram "$$(awk '/MemTotal/ {print $$2 "kB"}' /proc/meminfo)"; fi
	@# asv rewrites the tracked asv_results/benchmarks.json on every run: put it back afterwards
	@# (after publish, which reads it), whatever the run's outcome
	mkdir -p .asv && cp asv_results/benchmarks.json .asv/benchmarks.json.tracked
	$(ASV_ENV) $(ASV) run --quick --show-stderr --machine $(ASV_MACHINE) -b '^(?!.*Cuda)' \
	  $(ASV_RANGE); status=$$?; $(ASV) publish || status=1; \
	  cp .asv/benchmarks.json.tracked asv_results/benchmarks.json; exit $$status
