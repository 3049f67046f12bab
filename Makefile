# Every target creates .venv/ in the repo root on first use and installs the project into it,
# so a fresh clone needs nothing but Python 3.11+ (and Java 17 for the Spark parts).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## run: the main job on the embedded defaults
run: $(STAMP)
	$(BIN)/dcpkv demo

## test: lint + the whole test suite
test: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest

## lint: ruff, the layer contract (import-linter), mypy (see pyproject.toml for both)
lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/lint-imports
	$(BIN)/mypy

## bench: every benchmark under bench/
bench: $(STAMP)
	$(BIN)/python bench/codec.py
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/kv.py
	$(BIN)/python bench/dcp.py
	$(BIN)/python bench/stream.py
	$(BIN)/python bench/spark.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
