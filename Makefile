# The two commands: `make demo` and `make test`. Both install what they need from a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: test lint typecheck unit install bench clean demo

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall only when the package metadata changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,pipeline]'
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy --strict

unit: install
	$(BIN)/pytest

test: lint typecheck unit

demo: install
	BIN=$(BIN) bash examples/demo_cli.sh
	$(BIN)/python examples/demo_session.py

bench: install
	$(BIN)/python benchmarks/serialization.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
