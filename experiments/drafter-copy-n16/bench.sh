#!/usr/bin/env bash
# Issue 11: the copy gate and N = 16, each measured, in one bench run: `copy` = the N = 16 drafter (train.sh here),
# `gate` = the copy-gate drafter it started from (experiments/drafter-copy-gate), `before` = the shipped drafter
# (experiments/drafter-copy-2), plus plain and the n-gram lookup; float32, greedy, 12 prompts per set, chains and
# 32-node trees (experiments/drafter-copy/bench.sh). Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
NEW="${NEW:-runs/drafter-copy-n16/drafter}" BENCH_OUT="${BENCH_OUT:-experiments/drafter-copy-n16/bench}" \
  bash experiments/drafter-copy/bench.sh --drafter "gate=${GATE:-runs/drafter-copy-gate/drafter}"
