#!/usr/bin/env bash
# Does retiring a drafter that does not pay (policy.py) cost anything where the drafter does pay? The
# transformers backend in float32 (exact greedy), with and without --keep-drafter, back to back.
# Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
out=${BENCH_OUT:-experiments/retire-transformers}
common=(--dtype float32 --sets chat,code,humaneval --n "${N:-4}" --max-new-tokens 96 --temperatures 0
        --methods plain,ngram --trees 0 --memory-contexts '' --threads 2
        --drafter default --drafter v2=hyflash/assets/drafters/smollm2-135m)
.venv/bin/hyflash bench "${common[@]}" --out "$out/retire"
.venv/bin/hyflash bench "${common[@]}" --keep-drafter --out "$out/keep"
