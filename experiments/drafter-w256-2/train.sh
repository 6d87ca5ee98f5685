#!/usr/bin/env bash
# Issue 11: the window-256 drafter (experiments/drafter-w256, trimmed to its 2,048 most frequent draft ids and
# shipped as --drafter default since 2026-12-02, fourth session) trained on: a second pass over the same data in
# a new order (--seed 1; the runs before it all used seed 0's order and stopped inside the first epoch). The
# 2,048-id head makes a step cheaper than the 8,192-id runs before it. Same recipe otherwise (CE, exp slot
# weights with gamma 4, block 8, 8 sequences x 64 anchors, features on the fly). Resumable: rerun with --resume.
# Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
.venv/bin/hyflash train --data data/smollm2-135m/train-v2 data/smollm2-135m/long-v1 data/smollm2-135m/train-v3 \
  --init "${INIT:-experiments/drafter-w256/drafter-2048}" --out "${OUT:-runs/drafter-w256-2}" --seed 1 \
  --steps "${STEPS:-1400}" --batch-size 8 --anchors 64 --lr 7e-4 --warmup-steps 30 --gamma 4 --max-length 4096 \
  --save-every 50 --log-every 10 --eval-at 1,400,800 --eval-prompts 12 --eval-new-tokens 96 --threads 2 \
  --no-progress "$@"
