#!/usr/bin/env bash
# Issue 5: the six equal-budget drafters (train_runs.sh) side by side, greedy, short to long context.
cd "$(dirname "$0")/../../.."
while [ ! -f runs/kinds/DONE ]; do sleep 10; done
.venv/bin/hyflash bench --sets code,long-2k,long-8k --n 3 --max-new-tokens 48 --temperatures 0 --methods plain \
  --drafter hyflash-d1=runs/kinds/hyflash-1/drafter --drafter full-d1=runs/kinds/full-1/drafter \
  --drafter local-d1=runs/kinds/local-1/drafter --drafter memory-d1=runs/kinds/memory-1/drafter \
  --drafter hyflash-d2=runs/kinds/hyflash-2/drafter --drafter full-d2=runs/kinds/full-2/drafter \
  --memory-contexts '' --threads 1 --out docs/results/kinds > runs/kinds/eval.log 2>&1
echo done > runs/kinds/EVAL_DONE
