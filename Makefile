# rankkit: `make demo` sets everything up and runs the main job; `make test` runs the tests.
#
# The virtualenv pins the local CPU build of torch (torch==2.13.0). On a GPU machine pick
# any recent CUDA build instead, e.g. `make demo TORCH="torch==2.11.0"`, or install torch
# into the venv yourself first: every later step keeps whatever torch the venv holds.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
EXTRAS ?= dev,notebooks
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=
# `make test` runs the suite on two worker processes (pytest-xdist, in the dev extra): about 8
# minutes on 2 idle cores against 12 in one process. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

.PHONY: venv demo test test-fast lint bench docs clean

# One install stamp per set of extras: `make test EXTRAS=dev,notebooks,gpu` on an existing .venv
# installs what the new extras add.
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py rankkit/kernels/_cpu.c rankkit/kernels/_lambdas.c Makefile
	$(PYTHON) -m venv $(VENV)
	echo "$(TORCH)" > $(VENV)/torch-constraint.txt
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -c $(VENV)/torch-constraint.txt -e ".[$(EXTRAS)]"
	touch $@

demo: venv
	$(VENV)/bin/rankkit info mq2008
	$(VENV)/bin/rankkit compare --config compare

test: venv
	$(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Regenerate the generated sections of README.md and docs/ by the commands they quote:
# `make docs` reruns every one (hours on 2 cores), `make docs SECTIONS=padding_waste,demo` some;
# `python experiments/regenerate_docs.py --list` says which are rerun and which are assembled by hand.
docs: venv
	$(PY) experiments/regenerate_docs.py $(if $(SECTIONS),$(subst $(comma), ,$(SECTIONS)),--all)

# ruff, then mypy on how the front ends are called (pyproject.toml's [tool.mypy]: tests/typecheck/).
lint: venv
	$(VENV)/bin/ruff check rankkit tests experiments
	$(VENV)/bin/mypy

test-fast: venv
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis lightning_logs
