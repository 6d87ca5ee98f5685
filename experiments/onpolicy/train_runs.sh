#!/usr/bin/env bash
# Issue 7 comparisons: continue the shipped drafter with equal wall-clock compute, two seeds per arm.
#   train_runs.sh             first comparison: CE only (400 steps) vs CE + REOPOLD term (100 steps; each step
#                             ~4x the cost), all four runs in parallel
#   train_runs.sh acceptance  second objective: CE + exact acceptance term, 100 steps, the two seeds in turn
set -u
common="--data data/smollm2-135m/train --feature-cache cache/features --init hyflash/assets/drafters/smollm2-135m \
  --batch-size 4 --anchors 16 --max-length 1024 --lr 3e-4 --warmup-steps 5 --eval-prompts 0 \
  --threads 1 --no-plot --log-every 5 --save-every 1000"
run() { /usr/bin/time -f "%e s wall" .venv/bin/hyflash train $common --out runs/op/$1 --seed $2 "${@:3}" > runs/op/$1.log 2>&1; }
case "${1:-reopold}" in
  reopold)
    rl="--steps 100 --onpolicy-weight 0.5 --onpolicy-temperature 1.0 --reward-floor -2 --entropy-top-fraction 0.5 --switch-step 25"
    run ce-0 0 --steps 400 & run rl-0 0 $rl & run ce-1 1 --steps 400 & run rl-1 1 $rl & wait
    echo done > runs/op/DONE ;;
  acceptance)
    acc="--steps 100 --onpolicy-weight 1.0 --onpolicy-temperature 1.0 --onpolicy-objective acceptance"
    run acc-0 0 $acc; run acc-1 1 $acc
    echo done > runs/op/ACC_DONE ;;
  *) echo "usage: $0 [reopold|acceptance]" >&2; exit 2 ;;
esac
