#!/usr/bin/env bash
# Issue 4: the shipped drafter (runs 1+2, 610 steps) against run 3 (1,200 more steps on the same data),
# HumanEval chat prompts, greedy, 128 new tokens, bf16, plain decoding in the same run.
cd "$(dirname "$0")/../.."
.venv/bin/hyflash bench --sets humaneval --n 6 --max-new-tokens 128 --temperatures 0 --methods plain \
  --drafter shipped=default --drafter run3=runs/smollm2-default-3/drafter \
  --memory-contexts '' --threads 1 --out experiments/training/run3-vs-shipped
