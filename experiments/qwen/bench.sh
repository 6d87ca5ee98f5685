#!/usr/bin/env bash
# Issue 37 item 5: every method on qwen2.5-coder-1.5b (Q4_K_M) on llama.cpp, in one run. Run from the
# repository root; results in experiments/qwen/bench/ (results.json, table.md, plots).
#   bash experiments/qwen/bench.sh [more hyflash bench flags]      N=3 bash ... for 3 prompts a set
# Methods: llama-cpp-python's own loop and prompt lookup, hyflash plain and n-gram, draft-model speculation with
# the 0.5B, and, once a HyFlash drafter is trained for this model (DRAFTER, default runs/qwen-drafter/drafter),
# that drafter alone (`hyflash`) and `--drafter default` (the hybrid of the shipped drafter and the n-gram
# lookup; without a shipped drafter, default is the n-gram lookup, the `ngram` row).
set -eu
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
N=${N:-2}
DRAFTER=${DRAFTER:-runs/qwen-drafter/drafter}
trained=()
if [ -f "$DRAFTER/config.json" ]; then
  trained=(--drafter "hyflash=$DRAFTER" --drafter default=default)
fi
exec /work/shared/bin/heavy /work/main/.venv/bin/python -c 'import sys; from hyflash.cli import main; sys.exit(main())' \
  bench --backend llama.cpp --model qwen2.5-coder-1.5b \
  --methods llamacpp-plain,llamacpp-prompt-lookup,plain,ngram --drafter draft-0.5b=model:qwen2.5-coder-0.5b \
  "${trained[@]}" --sets humaneval,chat,chat-wild,code,prose,long-4k --n "$N" --max-new-tokens 96 \
  --temperatures 0,0.7 --memory-contexts '' --threads 2 --out experiments/qwen/bench "$@"
