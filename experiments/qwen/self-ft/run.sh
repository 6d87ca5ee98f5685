#!/usr/bin/env bash
# Issue 37: the shipped Qwen drafter fine-tuned on the self-instruct answers, then scored (every draft verified)
# on chat-wild and the five bench sets against the shipped one.
set -euo pipefail
cd "$(dirname "$0")/../../.."
STEPS=500 EVAL_AT=1,250,500 DATA=data/qwen2.5-coder-1.5b/train-self OUT=runs/qwen-drafter-self-ft \
  PY=.venv/bin/python bash experiments/qwen/train.sh --resume --init hyflash/assets/drafters/qwen2.5-coder-1.5b \
  --lr 3e-4
drafters=(--methods ngram --drafter shipped=hyflash/assets/drafters/qwen2.5-coder-1.5b
  --drafter self-ft=runs/qwen-drafter-self-ft/drafter --threads 2)
bash experiments/qwen/acceptance.sh experiments/qwen/acceptance-chat-wild-self chat-wild 12 "${drafters[@]}"
bash experiments/qwen/acceptance.sh experiments/qwen/acceptance-sets-self humaneval,chat,code,prose,long-4k 2 \
  "${drafters[@]}"
