#!/usr/bin/env bash
# Issue 13: what a smaller draft vocabulary costs in acceptance on llama.cpp Q4_1 (its price is in
# draft_cost.md). The shipped drafter (8,192 ids) and `hyflash drafter trim` copies at 4,096 and 2,048 ids,
# every draft verified in full (--no-adaptive), greedy, as experiments/backends/tau.sh.
# SETS=a,b (default chat,humaneval,code), N (default 6) and BENCH_OUT choose another run.
# Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
out=${BENCH_OUT:-experiments/llamacpp/draft-vocab}
mkdir -p runs/trim
for n in 4096 2048; do .venv/bin/hyflash drafter trim default --draft-vocab $n --out runs/trim/vocab-$n; done
.venv/bin/hyflash bench --backend llama.cpp --no-adaptive --sets "${SETS:-chat,humaneval,code}" --n "${N:-6}" \
    --max-new-tokens 64 --temperatures 0 --methods plain --trees 0 --memory-contexts '' --threads 2 \
    --drafter default=hyflash/assets/drafters/smollm2-135m --drafter vocab-4096=runs/trim/vocab-4096 \
    --drafter vocab-2048=runs/trim/vocab-2048 --out "$out"
