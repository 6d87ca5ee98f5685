#!/usr/bin/env bash
# Issue 37: the shipped Qwen drafter fine-tuned on the self-instruct answers, then scored (every draft verified)
# on chat-wild and the five bench sets against the shipped one.
set -euo pipefail
cd "$(dirname "$0")/../../.."
STEPS=500 EVAL_AT=1,250,500 DATA=data/qwen2.5-coder-1.5b/train-self OUT=runs/qwen-drafter-self-ft \
  PY=.venv/bin/python bash experiments/qwen/train.sh --resume --init hyflash/assets/drafters/qwen2.5-coder-1.5b \
  --lr 3e-4
common=(--backend llama.cpp --model qwen2.5-coder-1.5b --no-adaptive --methods ngram
  --drafter shipped=hyflash/assets/drafters/qwen2.5-coder-1.5b --drafter self-ft=runs/qwen-drafter-self-ft/drafter
  --max-new-tokens 96 --temperatures 0 --memory-contexts '' --sweep-kinds '' --threads 2)
.venv/bin/python -m hyflash.cli bench "${common[@]}" --sets chat-wild --n 12 \
  --out experiments/qwen/acceptance-chat-wild-self
.venv/bin/python -m hyflash.cli bench "${common[@]}" --sets humaneval,chat,code,prose,long-4k --n 2 \
  --out experiments/qwen/acceptance-sets-self
