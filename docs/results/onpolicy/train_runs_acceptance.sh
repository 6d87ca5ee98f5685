#!/usr/bin/env bash
# Issue 7, second objective: the same continuation as train_runs.sh (same start, data, batch, lr, seeds, 100
# steps like the REOPOLD arm), with the exact acceptance term instead of REOPOLD credit.
set -u
common="--data data/smollm2-135m/train --feature-cache cache/features --init hyflash/assets/drafters/smollm2-135m \
  --batch-size 4 --anchors 16 --max-length 1024 --lr 3e-4 --warmup-steps 5 --eval-prompts 0 \
  --threads 1 --no-plot --log-every 5 --save-every 1000"
run() { /usr/bin/time -f "%e s wall" .venv/bin/hyflash train $common --out runs/op/$1 --seed $2 "${@:3}" > runs/op/$1.log 2>&1; }
acc="--steps 100 --onpolicy-weight 1.0 --onpolicy-temperature 1.0 --onpolicy-objective acceptance"
run acc-0 0 $acc; run acc-1 1 $acc
echo done > runs/op/ACC_DONE
