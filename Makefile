# Two entry points: `make demo` (install, then check every shipped spec against the interpreter)
# and `make test` (install, then the test suite). Each installs what it needs into .venv: the demo
# only the package and its core dependencies, the tests the dev extras on top.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch and the Triton release the GPU runs (3.6), so the Triton interpreter
# in CI matches the compiler on the GPU; numpy 2.4 breaks the 3.6 interpreter's loops.
PINS := torch==2.13.0 "triton==3.6.*" "numpy<2.4"

.PHONY: demo test lint bench-cpu clean

# The package and what it imports, nothing else: the demo's install is most of its time.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e . $(PINS)
	touch $@

# pytest, hypothesis, ruff, matplotlib and transformers on top of it.
$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e ".[dev]" $(PINS)
	touch $@

# The check draws its random inputs on the CPU, where generated Triton kernels run in Triton's interpreter;
# --quick runs one training and one inference case per spec and backend (all eight take about four times as long).
demo: $(VENV)/.installed
	$(BIN)/lamixer list
	$(BIN)/lamixer explain gsa
	TRITON_INTERPRET=1 $(BIN)/lamixer check --all --quick

# one test process per core (pytest-xdist); idle ones take queued tests from busy ones (worksteal): the sm_90
# compilation test holds one process for most of the run
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n auto --dist worksteal

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check lamixer tests bench examples generated

bench-cpu: $(VENV)/.installed
	$(BIN)/python bench/torch_vs_interpret.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
