#!/usr/bin/env bash
# Issue 11: tau per set of the drafter trained on for a second pass (train.sh, NEW), the drafter shipped before it
# (window 256, 2,048 ids, OLD) and the n-gram lookup, in one run; each drafter alone, as a chain and verifying a
# best-first tree of up to 32 nodes in one pass. Transformers float32, greedy, so every speculative text must
# equal plain; every draft verified in full (--no-adaptive), so tau measures the drafter and not the policy.
# Run from the repository root under ../shared/bin/heavy. N = prompts per set (default 4).
set -euo pipefail
new=${NEW:-runs/drafter-w256-2/drafter}
old=${OLD:-experiments/drafter-w256/drafter-2048}
.venv/bin/hyflash bench --dtype float32 --no-adaptive --sets chat,humaneval,code,prose --n "${N:-4}" \
  --max-new-tokens 64 --temperatures 0 --methods plain,ngram --drafter "new=$new" --drafter "w256=$old" \
  --trees "${TREES:-0,32}" --memory-contexts '' --threads 2 --out "${BENCH_OUT:-experiments/drafter-w256-2/bench}"
