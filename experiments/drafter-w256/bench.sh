#!/usr/bin/env bash
# Issue 11: tau per set of the drafter trained with a 256-token window (train.sh), the drafter it started from
# (v2, shipped until 2026-12-02, window 64) and the n-gram lookup, in one run. Transformers float32, greedy, so
# every speculative text must equal plain; every draft verified in full (--no-adaptive), so tau measures the
# drafter and not the policy; each drafter alone (no n-gram beside it). Run from the repository root under
# ../shared/bin/heavy. NEW / OLD name the two drafter folders, N the prompts per set (default 6).
set -euo pipefail
new=${NEW:-runs/drafter-w256/drafter}
old=${OLD:-runs/shipped-8192}
.venv/bin/hyflash bench --dtype float32 --no-adaptive --sets chat,humaneval,code,prose --n "${N:-6}" \
  --max-new-tokens 64 --temperatures 0 --methods plain,ngram --drafter "w256=$new" --drafter "v2=$old" \
  --trees 0 --memory-contexts '' --threads 2 --out "${BENCH_OUT:-experiments/drafter-w256/bench}"
