#!/usr/bin/env bash
# Issue 5: every drafter kind at depth 1 (and full / hyflash at depth 2), same data, recipe and budget.
# SEED=1 SPECS="hyflash:1 full:1 local:1 memory:1" experiments/kinds/train_runs.sh repeats a subset with
# another seed (runs/kinds-seed1/).
set -u
cd "$(dirname "$0")/../.."
seed=${SEED:-0}
root=runs/kinds; [ "$seed" != 0 ] && root=runs/kinds-seed$seed
common="--data data/smollm2-135m/train --feature-cache cache/features --steps 400 --batch-size 8 --anchors 16 \
  --block-size 8 --window 64 --draft-vocab-size 8192 --lr 2e-3 --warmup-steps 20 --gamma 4 --seed $seed \
  --eval-prompts 0 --save-every 50 --log-every 10 --threads 1 --no-progress"
mkdir -p $root
for spec in ${SPECS:-hyflash:1 full:1 local:1 memory:1 hyflash:2 full:2}; do
  kind=${spec%:*}; depth=${spec#*:}
  [ -f $root/$kind-$depth/drafter/config.json ] && continue
  /usr/bin/time -f "%e s wall" .venv/bin/hyflash train $common --kind $kind --num-layers $depth \
    --out $root/$kind-$depth --resume >> $root/$kind-$depth.log 2>&1
done
echo done > $root/DONE
