#!/usr/bin/env bash
# Data for issue 11, short-context part: target-written answers to ~8.8k stdlib/docs prompts (resumable:
# rerun the same command). Long-context prompts go to a separate folder (their prefill dominates the cost).
exec .venv/bin/hyflash data --out data/smollm2-135m/train-v2 --feature-cache cache/features --num-prompts 0 \
  --per-module 12 --long-chars 0 --multiturn-every 3 --prose-per-package 150 \
  --batch-size 32 --max-new-tokens 192 --max-prompt-tokens 768 --sampled-fraction 0.2 --dtype bfloat16
