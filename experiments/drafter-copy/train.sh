#!/usr/bin/env bash
# Issue 11: the shipped drafter (experiments/drafter-w256-3's run, hyflash/assets/drafters/smollm2-135m) given a
# copy input (--copy-ngram 3: each draft slot also reads the token the longest recurring suffix of <= 3 tokens
# continues with, and a pointer can draft that token outside the 2,048-id vocabulary; docs/training.md §7) and
# trained on with the recipe of experiments/drafter-w256-2/train.sh in a fourth data order (--seed 3), scored on
# the same held-out prompts (--eval-seed 2). The new weights start at zero, so step 0 drafts as the shipped
# drafter does. Resumable: rerun with --resume. Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
INIT=hyflash/assets/drafters/smollm2-135m OUT="${OUT:-runs/drafter-copy}" STEPS="${STEPS:-900}" \
  bash experiments/drafter-w256-2/train.sh --seed 3 --eval-seed 2 --eval-at 300,600 --copy-ngram 3 "$@"
