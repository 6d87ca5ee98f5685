#!/usr/bin/env bash
# Issue 11: the copy gate (DrafterConfig.copy_gate): the second copy-input drafter (experiments/drafter-copy-2)
# grown with a learned bonus on each slot's copy-candidate logit (zero at the start, so step 0 drafts exactly as
# that drafter), trained on the same recipe in a sixth data order (--seed 5), 500 steps, peak rate 5e-4, scored
# at the end on the same held-out prompts (--eval-seed 2). Resumable: rerun with --resume. Run from the
# repository root under ../shared/bin/heavy.
set -euo pipefail
INIT="${INIT:-runs/drafter-copy-2/drafter}" OUT="${OUT:-runs/drafter-copy-gate}" STEPS="${STEPS:-500}" \
  bash experiments/drafter-w256-2/train.sh --seed 5 --eval-seed 2 --eval-at "" --copy-gate --lr 5e-4 "$@"
