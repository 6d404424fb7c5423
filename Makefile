# Two entry points for a fresh machine (see README.md):
#   make demo   install into .venv, then run the main job on a built-in workload
#   make test   install into .venv, then ruff, mypy and the test suite (what CI runs)
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: install demo test lint bench

$(BIN)/.installed: requirements/dev.txt requirements/constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements/dev.txt
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/autotune measure --workload gpt-tiny

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: install
	$(BIN)/python benchmarks/overhead.py
