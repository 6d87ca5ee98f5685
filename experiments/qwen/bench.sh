#!/usr/bin/env bash
# Issue 37 item 5: every method on qwen2.5-coder-1.5b (Q4_K_M) on llama.cpp, in one run. Run from the
# repository root; results in experiments/qwen/bench/ (results.json, table.md, plots).
# `--drafter default` is not a separate method here: no drafter ships for this model yet, so it runs the
# n-gram lookup (registry.build_drafter), which is the `ngram` row.
set -eu
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
N=${N:-2}
exec /work/shared/bin/heavy /work/main/.venv/bin/python -c 'import sys; from hyflash.cli import main; sys.exit(main())' \
  bench --backend llama.cpp --model qwen2.5-coder-1.5b \
  --methods llamacpp-plain,llamacpp-prompt-lookup,plain,ngram --drafter draft-0.5b=model:qwen2.5-coder-0.5b \
  --sets humaneval,chat,code,prose,long-4k --n "$N" --max-new-tokens 96 --temperatures 0,0.7 \
  --memory-contexts '' --threads 2 --out experiments/qwen/bench "$@"
