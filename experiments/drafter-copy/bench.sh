#!/usr/bin/env bash
# Issue 11: tau per set of the copy-input drafter (train.sh, NEW), the drafter it started from (shipped before it,
# OLD) and the n-gram lookup, in one run; each drafter alone, as a chain and verifying a best-first tree of up to
# 32 nodes. Transformers float32, greedy (every speculative text must equal plain), every draft verified in full
# (--no-adaptive), so tau measures the drafter and not the policy. N prompts per set (default 12; the runs before
# used 4); extra arguments go to `hyflash bench` (e.g. another --drafter NAME=PATH). Run from the repository root
# under ../shared/bin/heavy.
set -euo pipefail
new=${NEW:-runs/drafter-copy/drafter}
old=${OLD:-hyflash/assets/drafters/smollm2-135m}  # at the run: the drafter shipped since commit f47a300
.venv/bin/hyflash bench --dtype float32 --no-adaptive --sets chat,humaneval,code,prose --n "${N:-12}" \
  --max-new-tokens 64 --temperatures 0 --methods plain,ngram --drafter "copy=$new" --drafter "before=$old" \
  --trees "${TREES:-0,32}" --memory-contexts '' --threads 2 --out "${BENCH_OUT:-experiments/drafter-copy/bench}" "$@"
