#!/usr/bin/env bash
# Issue 11 lever: does the shipped drafter (trained with a 64-token attention window) accept more when it is
# given a wider window at inference only? Copies of its folder with window 128 / 256 / 512 (same weights),
# every draft verified in full, float32 greedy, 8 prompts of chat and code. Run from the repository root
# under ../shared/bin/heavy.
set -euo pipefail
for w in 128 256 512; do
  rm -rf runs/window/w$w && mkdir -p runs/window && cp -r hyflash/assets/drafters/smollm2-135m runs/window/w$w
  .venv/bin/python -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['window']=int(sys.argv[2]); json.dump(c, open(p, 'w'), indent=2)" runs/window/w$w/config.json $w
done
.venv/bin/hyflash bench --dtype float32 --no-adaptive --sets chat,code --n 8 --max-new-tokens 64 --temperatures 0 \
  --methods plain --drafter w64=hyflash/assets/drafters/smollm2-135m --drafter w128=runs/window/w128 \
  --drafter w256=runs/window/w256 --drafter w512=runs/window/w512 --trees 0 --memory-contexts '' --threads 2 \
  --out experiments/recipe/inference-window
