#!/usr/bin/env bash
# Issue 11: longer copy matches. The copy-gate drafter (experiments/drafter-copy-gate) grown from N = 3 to
# N = 16 (--copy-ngram 16: each new match length starts with length 3's vector, so step 0 reads every match as
# before, only the candidate may move to the occurrence sharing the longer suffix), trained on the same recipe
# in a seventh data order (--seed 6), 500 steps, peak rate 5e-4, scored at the end on the same held-out prompts.
# Why: on the bench's greedy texts a copy whose context agrees backwards for >= 4 tokens is accepted for 4-5
# tokens on average, one that agrees for exactly 3 for 1.6-2.0 (docs/training.md §7); with N = 3 the drafter
# sees both as "3". Resumable: rerun with --resume. Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
INIT="${INIT:-runs/drafter-copy-gate/drafter}" OUT="${OUT:-runs/drafter-copy-n16}" STEPS="${STEPS:-500}" \
  bash experiments/drafter-w256-2/train.sh --seed 6 --eval-seed 2 --eval-at "" --copy-ngram 16 --lr 5e-4 "$@"
