#!/usr/bin/env bash
# Issue 11: the copy-input drafter (experiments/drafter-copy's run, shipped as hyflash/assets/drafters/smollm2-135m
# since commit "ship the copy drafter") trained on: the recipe of experiments/drafter-w256-2/train.sh in a fifth
# data order (--seed 4), a lower peak rate (5e-4: the earlier re-warmed runs dipped while the rate was near its
# peak), 700 steps, scored at the end on the same held-out prompts (--eval-seed 2). Resumable: rerun with
# --resume. Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
INIT=hyflash/assets/drafters/smollm2-135m OUT="${OUT:-runs/drafter-copy-2}" STEPS="${STEPS:-700}" \
  bash experiments/drafter-w256-2/train.sh --seed 4 --eval-seed 2 --eval-at "" --copy-ngram 3 --lr 5e-4 "$@"
