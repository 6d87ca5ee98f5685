#!/usr/bin/env bash
# Issue 37: is the drafter's capacity what holds chat-wild at tau 1.8? The 0.5B draft model reaches 3.0-3.8 on the
# same twelve hand-written prompts (../acceptance-chat-wild-0.5b/), so the requests are predictable. Two drafters
# trained from scratch on the same data (train-self, whose features this machine has cached), same steps and
# recipe, one layer against two, then scored with every draft verified on chat-wild.
#   /work/shared/bin/heavy bash experiments/qwen/capacity/run.sh        (86 min on a Zen 4; rerun it to continue)
set -euo pipefail
cd "$(dirname "$0")/../../.."
steps=${STEPS:-500}
for layers in 1 2; do
  STEPS=$steps EVAL_AT=$steps DATA=data/qwen2.5-coder-1.5b/train-self OUT=runs/qwen-capacity-l$layers \
    PY=.venv/bin/python bash experiments/qwen/train.sh --resume --num-layers $layers
done
bash experiments/qwen/acceptance.sh experiments/qwen/capacity/chat-wild chat-wild 12 --methods ngram \
  --drafter layers1=runs/qwen-capacity-l1/drafter --drafter layers2=runs/qwen-capacity-l2/drafter --threads 2
