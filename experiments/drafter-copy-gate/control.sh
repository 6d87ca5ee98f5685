#!/usr/bin/env bash
# Issue 11: the copy gate's control. train.sh here without --copy-gate: the same start (experiments/drafter-copy-2's
# drafter), data order (--seed 5), steps, rate and held-out prompts, so the difference in held-out tau is the gate's.
# Resumable: rerun with --resume. Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
INIT="${INIT:-runs/drafter-copy-2/drafter}" OUT="${OUT:-runs/drafter-copy-gate-control}" STEPS="${STEPS:-500}" \
  bash experiments/drafter-w256-2/train.sh --seed 5 --eval-seed 2 --eval-at "" --lr 5e-4 "$@"
