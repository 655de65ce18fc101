# kernellab: `make lab` opens the tutorials in JupyterLab, `make test` runs the whole test suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kernellab-installed
PYTEST_ARGS ?=

.PHONY: lab test test-fast gpu-test install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Reinstall only when the package metadata changes.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q "torch==2.13.0" -e ".[torch,lab,test]"
	touch $(STAMP)

install: $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# Unit tests only (no notebooks, no browser): the quick loop while editing.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# On a GPU machine whose Python already has torch/cupy/numba (IPython and Jupyter may be missing):
# runs the GPU tests with the interpreter on PATH, no venv. See tools/gpu-test.sh.
gpu-test:
	bash tools/gpu-test.sh

clean:
	rm -rf $(VENV) .pytest_cache
