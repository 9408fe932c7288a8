# Set-up and the two quick-start jobs. TORCH picks the torch build: the default is the CPU wheel these
# machines carry; elsewhere e.g. TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# (CPU) or TORCH="torch==2.13.0" on a CUDA machine. See README, "Choosing a torch build".
VENV  ?= .venv
TORCH ?= torch==2.13.0
PY    := $(VENV)/bin/python
EXTRAS ?= dev

.PHONY: setup run test
setup: $(VENV)/.kvparity-installed

$(VENV)/.kvparity-installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

run: setup
	$(VENV)/bin/kvparity run --engine reference --profile ci

test: setup
	$(PY) -m pytest -n 2 -q tests
