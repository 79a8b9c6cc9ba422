# pagebench: `make report` runs the main job, `make test` runs the whole test suite.
# Both create .venv on first use and install the project into it from this repository.

PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.pagebench-installed
# A CPU-only machine must never pull a multi-GB CUDA build: torch is installed first, pinned.
# Elsewhere, point pip at the wheel you want, e.g.
#   make test TORCH_PIP_ARGS="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP_ARGS ?= torch==2.13.0
REPORT_ARGS ?=
PYTEST_ARGS ?=

.PHONY: report test bench bench-compare asv-quick clean-venv browser-deps

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH_PIP_ARGS)
	$(PY) -m pip install --quiet -e ".[all]"
	touch $(STAMP)

report: $(STAMP)
	$(PY) -m pagebench report $(REPORT_ARGS)

# Headless Chromium for the report's browser test (Debian's package; needs root or sudo).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) browser-deps
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
