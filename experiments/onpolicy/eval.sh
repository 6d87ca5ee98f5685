#!/usr/bin/env bash
# Held-out tau of the shipped drafter and its four continuations, greedy and T=1 (issue 7).
while [ ! -f runs/op/DONE ]; do sleep 5; done
.venv/bin/hyflash bench --sets humaneval,code --n 3 --max-new-tokens 48 --temperatures 0,1.0 --methods plain \
  --drafter base=default --drafter ce0=runs/op/ce-0/drafter --drafter ce1=runs/op/ce-1/drafter \
  --drafter rl0=runs/op/rl-0/drafter --drafter rl1=runs/op/rl-1/drafter \
  --memory-contexts '' --threads 2 --out experiments/onpolicy > runs/op/eval.log 2>&1
echo done > runs/op/EVAL_DONE
