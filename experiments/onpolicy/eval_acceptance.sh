#!/usr/bin/env bash
# Issue 7, second comparison: the shipped drafter and its six equal-compute continuations (CE only, CE +
# REOPOLD credit, CE + exact acceptance; seeds 0 and 1), greedy and T=1, 6 prompts x 64 tokens per set.
while [ ! -f runs/op/ACC_DONE ]; do sleep 10; done
.venv/bin/hyflash bench --sets humaneval,code --n 6 --max-new-tokens 64 --temperatures 0,1.0 --methods plain \
  --drafter base=default --drafter ce0=runs/op/ce-0/drafter --drafter ce1=runs/op/ce-1/drafter \
  --drafter rl0=runs/op/rl-0/drafter --drafter rl1=runs/op/rl-1/drafter \
  --drafter acc0=runs/op/acc-0/drafter --drafter acc1=runs/op/acc-1/drafter \
  --memory-contexts '' --threads 1 --out experiments/onpolicy/run2 > runs/op/eval2.log 2>&1
echo done > runs/op/EVAL2_DONE
