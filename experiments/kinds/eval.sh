#!/usr/bin/env bash
# Issue 5: the equal-budget drafters of train_runs.sh side by side, greedy, short to long context.
# SEED=1 evaluates the depth-1 repeats of runs/kinds-seed1/ into experiments/kinds/seed1/.
cd "$(dirname "$0")/../.."
seed=${SEED:-0}
if [ "$seed" = 0 ]; then root=runs/kinds out=experiments/kinds; else root=runs/kinds-seed$seed out=experiments/kinds/seed$seed; fi
while [ ! -f $root/DONE ]; do sleep 10; done
drafters=""
for d in hyflash-1 full-1 local-1 memory-1 hyflash-2 full-2; do
  [ -d $root/$d/drafter ] && drafters="$drafters --drafter ${d%-*}-d${d##*-}=$root/$d/drafter"
done
.venv/bin/hyflash bench --sets code,long-2k,long-8k --n 3 --max-new-tokens 48 --temperatures 0 --methods plain \
  $drafters --memory-contexts '' --threads 1 --out $out > $root/eval.log 2>&1
echo done > $root/EVAL_DONE
