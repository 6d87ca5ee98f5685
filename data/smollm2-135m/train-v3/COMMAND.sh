#!/usr/bin/env bash
# Data for issue 11, top-up to >= 1.5M target-written tokens: the settings of train-v2 with --seed 1 (other
# functions, cut points and kinds drawn from the same training modules and packages; the held-out split is
# by module, independent of the seed), first 1,000 prompts of that list. Resumable: rerun the same command.
exec .venv/bin/hyflash data --out data/smollm2-135m/train-v3 --feature-cache cache/features --seed 1 --num-prompts 1000 \
  --per-module 12 --long-chars 0 --multiturn-every 3 --prose-per-package 150 \
  --batch-size 32 --max-new-tokens 192 --max-prompt-tokens 768 --sampled-fraction 0.2 --dtype bfloat16 "$@"
