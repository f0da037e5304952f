# posttrain: the two commands are `make demo` and `make test`; both set everything up first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TORCH  ?= torch==2.13.0
# pytest-xdist is not used: the suite already starts worker processes of its own.
PYTEST_ARGS ?=

.PHONY: setup test test-fast demo compile clean help

help:
	@echo "make demo     set up .venv and run the whole pipeline locally (kfp.local, tiny model)"
	@echo "make test     set up .venv and run the test suite"
	@echo "make compile  recompile pipelines/compiled/*.yaml"

# torch first and pinned: an unpinned requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not distributed" $(PYTEST_ARGS)

demo: setup
	$(BIN)/posttrain pipeline run --root runs/demo

compile: setup
	$(BIN)/posttrain pipeline compile

clean:
	rm -rf runs .pytest_cache
