#!/usr/bin/env bash
# Issue 11: a third pass. The shipped drafter (experiments/drafter-w256-2's run, committed as
# hyflash/assets/drafters/smollm2-135m) trained on with the same recipe as that run (experiments/drafter-w256-2/
# train.sh), in a third data order (--seed 2), 1,800 steps, scored on the same held-out prompts as that run
# (--eval-seed 2) so the two runs' held-out tau join into one curve. Resumable: rerun with --resume.
# Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
INIT=hyflash/assets/drafters/smollm2-135m OUT="${OUT:-runs/drafter-w256-3}" STEPS="${STEPS:-1800}" \
  bash experiments/drafter-w256-2/train.sh --seed 2 --eval-seed 2 --eval-at 1,600,1200 "$@"
