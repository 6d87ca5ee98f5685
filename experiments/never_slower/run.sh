#!/usr/bin/env bash
# Issue 36's "never slower" suite: plain decoding vs `--drafter default` with default settings, on both backends,
# greedy and T = 0.7, 96 new tokens, on the bench set `never-slower` (prose and code at 128 / 1.5k / 6k tokens of
# context, two short chat requests; held out: hyflash/bench/datasets.py). Same-run ratios, prompt by prompt.
#
#   /work/shared/bin/heavy experiments/never_slower/run.sh [RUNS_DIR]      (~50 min on 2 CPU cores)
#
# Each generation is timed REPEATS times (default 5; methods in rotated order, each repeat from the same policy
# state): the prompt's ratio is the median of the repeats' paired ratios, since one run's speed moves by ~5% from
# run to run on these machines, as much as the margin the bar leaves. On llama.cpp a repeat reuses the prompt's
# cached chunks where its prefill wants no features (docs/engine.md), so repeats at 6k tokens cost their decode.
# Environment: PY, REPEATS, BACKENDS (default "transformers llama.cpp").
#
# Raw bench folders go to RUNS_DIR (default experiments/never_slower/runs, ignored by git); the summary
# (results.json, results.md, ratio_vs_context.png) to experiments/never_slower/.
set -euo pipefail
RUNS=${1:-experiments/never_slower/runs}
PY=${PY:-python}
for backend in ${BACKENDS:-transformers llama.cpp}; do
  dtype=$([ "$backend" = transformers ] && echo float32 || echo auto)
  "$PY" -m hyflash.cli bench --backend "$backend" --dtype "$dtype" --sets never-slower --n 3 --max-new-tokens 96 --repeats "${REPEATS:-5}" \
    --temperatures 0,0.7 --methods plain --drafter default=default --memory-contexts '' --sweep-kinds '' \
    --out "$RUNS/$backend"
done
"$PY" -m experiments.never_slower.summarize "$RUNS" experiments/never_slower
