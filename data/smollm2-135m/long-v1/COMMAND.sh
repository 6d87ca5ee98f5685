#!/usr/bin/env bash
# Data for issue 11, long-context part: the target continues 112 long prefixes (96, then NUM_PROMPTS=112 added 16) (8k-16k characters, ~2.3k-4.6k
# tokens, of big standard-library modules, ending inside a function), one per module. float32, because on
# the AMD EPYC (Zen 5) this ran on, a bfloat16 step at 3.6k tokens of context decoded 2.6x slower than a
# float32 one (4.4 vs 11.5 tok/s, measured beside a training job); the features are filed for the bfloat16
# training runs. Resumable: rerun the same command.
exec .venv/bin/hyflash data --out ${OUT_DIR:-data/smollm2-135m/long-v1} --feature-cache cache/features --feature-dtype bfloat16 \
  --num-prompts ${NUM_PROMPTS:-112} --kinds long --long-chars 16000 --long-every 0 --long-per-module 1 \
  --long-batch-size 1 --long-new-tokens ${LONG_NEW_TOKENS:-128} --shard-prompts 16 --sampled-fraction 0.2 --dtype float32 "$@"
