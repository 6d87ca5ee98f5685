#!/usr/bin/env bash
# Issue 37, the drafter's generalisation: data from requests Qwen2.5-Coder-1.5B writes itself (`hyflash prompts
# --self-instruct`, docs/training.md), answered by the same model on llama.cpp, then the drafter trained again on
# train-varied plus that data and scored on the hand-written chat-wild prompts it has never seen. The prompts are
# done (1,000, 2026-12-07); the data stage was started then. Every stage resumes, and what must outlive the machine
# is in the checkout (commit it after a session):
#
#   /work/shared/bin/heavy bash experiments/qwen/self_instruct.sh        (hours on 2 cores; background it)
#   DRY_RUN=1 bash experiments/qwen/self_instruct.sh                     the commands, nothing run
#   TRAIN_DATA=data/qwen2.5-coder-1.5b/train-self STEPS=500 OUT=runs/qwen-drafter-self-ft \
#     TRAIN_FLAGS="--init hyflash/assets/drafters/qwen2.5-coder-1.5b --lr 3e-4" ../shared/bin/heavy bash ...
#       the shipped drafter fine-tuned on the new data alone, on the features the data stage cached (training on
#       both folders on a new machine first records train-varied's again: ~718k tokens at ~100 tok/s, ~2 h)
#       (tried 2026-12-07: chat-wild tau 1.80 -> 1.83, not shipped; experiments/qwen/README.md section 5)
#   git add experiments/qwen/self-instruct-prompts.jsonl data/qwen2.5-coder-1.5b/train-self
#
# Stages: prompts (NUM_PROMPTS requests; 64 per llama.cpp batch, ~10 kept a minute on a Zen 4), data (the answers,
# 192 new tokens, features from llama.cpp's eval callback in the same passes: ~1h28m for 1,000 on a Zen 4), train
# (experiments/qwen/train.sh on TRAIN_DATA, both folders unless told; on a new machine its first epoch records the
# features again), then the chat-wild acceptance.
# Environment: NUM_PROMPTS (1000: the data folder's manifest pins the prompts file, so do not grow it under a
# started data folder), OUT (runs/qwen-drafter-self), TRAIN_DATA, TRAIN_FLAGS (more `hyflash train` flags, split on
# spaces), STEPS (train.sh's), FEATURES, PYTHON, DRY_RUN.
set -euo pipefail
die() { echo "self_instruct: error: $*" >&2; exit 2; }
cd "$(dirname "$0")/../.."
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
dry="${DRY_RUN:-0}" num="${NUM_PROMPTS:-1000}" out="${OUT:-runs/qwen-drafter-self}"
features="${FEATURES:-/work/cache/features}"  # outside the checkout: a new checkout on this machine keeps it
[[ "$num" =~ ^[1-9][0-9]*$ ]] || die "NUM_PROMPTS must be a whole number >= 1, got '$num'"
prompts=experiments/qwen/self-instruct-prompts.jsonl data=data/qwen2.5-coder-1.5b/train-self
run() { echo "+ $*"; [ "$dry" = 1 ] || "$@"; }

run "$py" -m hyflash.cli prompts --self-instruct "$num" --model qwen2.5-coder-1.5b --backend llama.cpp \
  --out "$prompts" --no-progress
run "$py" -m hyflash.cli data --backend llama.cpp --model qwen2.5-coder-1.5b --prompts "$prompts" \
  --num-prompts 0 --shard-prompts 64 --out "$data" --feature-cache "$features" --no-progress
read -ra train_flags <<< "${TRAIN_FLAGS:-}"
run env PY="$py" FEATURES="$features" DATA="${TRAIN_DATA:-data/qwen2.5-coder-1.5b/train-varied $data}" OUT="$out" \
  bash experiments/qwen/train.sh --resume ${train_flags[@]+"${train_flags[@]}"}
run env PY="$py" bash experiments/qwen/acceptance.sh experiments/qwen/acceptance-chat-wild-self chat-wild 12 \
  --methods plain,ngram --drafter shipped=hyflash/assets/drafters/qwen2.5-coder-1.5b --drafter self="$out/drafter"
