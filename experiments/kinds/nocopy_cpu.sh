#!/usr/bin/env bash
# Issue 41 on a 2-core CPU: the kinds grid WITHOUT the copy input, over as many sessions as it takes. Every stage is
# resumable and skipped once done, so the same command goes on where it stopped:
#
#   ../shared/bin/heavy experiments/kinds/nocopy_cpu.sh runs/kinds-nocopy      the run (hours; background it)
#   DRY_RUN=1 experiments/kinds/nocopy_cpu.sh runs/kinds-nocopy                the commands, nothing run
#
# Stages:
#   data     NEW_LONG (192) more long target-written sequences (seed 2: other cut points than long-v1's seed 0;
#            16,000 characters like long-v1, ~4-5k tokens: training crops at 4,096; float32, which decodes long
#            prompts faster than bf16 here, docs/training.md section 5; 192 new tokens), their features filed in
#            OUT/features as bf16 while generating. Measured: one 24,000-character prompt (7,055 tokens) took 47 s
#            with 8 new tokens, so expect ~25-40 s a prompt, 1.5-2 h in all. With long-v1 (112) and train-v3 (1,000
#            short sequences) about (112 + 192) / 1,304 = 23% of training anchors have > 1,024 tokens of context
#            (issue 41: >= 20%; grid.sh writes the measured share to OUT/grid/anchor_context.json).
#   train    the 12 runs through grid.sh (SCALE=cpu: 500 steps x 8 sequences x 64 anchors, the copy grid's budget;
#            COPY_NGRAM=0), the claims' pairs first: hyflash/full at depth 1, then depth 2, then local/memory.
#   bench    `hyflash bench --replay` on ctx-1k ... ctx-8k (12 cut points each, 32 new tokens, greedy, float32):
#            one recorded decode per prompt, every drafter replayed against it (bench/replay.py), and the draft
#            memory sweep at each context. Training stops at 4,096 tokens, so ctx-6k and ctx-8k are the
#            extrapolation sets.
#   summary  experiments/kinds/summarize_nocopy.py: claims (a)-(d) with the seed-spread noise rule and a paired
#            per-prompt bootstrap, beside the copy grid; draft memory and time per context; the plot.
#
# Environment: NEW_LONG (192), RUNS (the 12, in this order), BENCH_N (12), BENCH_NEW (32), PYTHON, DRY_RUN.
set -euo pipefail
die() { echo "nocopy_cpu: error: $*" >&2; exit 2; }
[ $# -eq 1 ] || die "usage: experiments/kinds/nocopy_cpu.sh OUTDIR"
mkdir -p -- "$1" || die "cannot create OUTDIR '$1'"
out="$(cd -- "$1" && pwd)"
cd "$(dirname "$0")/../.."
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
dry="${DRY_RUN:-0}" new_long="${NEW_LONG:-192}" bench_n="${BENCH_N:-12}" bench_new="${BENCH_NEW:-32}"
for v in new_long bench_n bench_new; do [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "${v^^} must be a whole number >= 1"; done
runs="${RUNS:-hyflash-d1-s0 full-d1-s0 hyflash-d1-s1 full-d1-s1 hyflash-d2-s0 full-d2-s0 hyflash-d2-s1 full-d2-s1
      local-d1-s0 memory-d1-s0 local-d1-s1 memory-d1-s1}"
runs=$(echo $runs)
run() { echo "+ $*"; [ "$dry" = 1 ] || "$@"; }
stamp() { echo "== $1 ($(date -u +%H:%M:%S) UTC)"; }

# ----- data: resumable shards (hyflash data continues a folder), features filed as they are computed -----
stamp "data: $new_long long prompts"
run "$py" -m hyflash.cli data --out "$out/data-long" --model smollm2-135m --seed 2 --kinds long --long-every 0 \
  --num-prompts "$new_long" --long-chars 16000 --long-per-module 4 --long-batch-size 1 --long-new-tokens 192 \
  --shard-prompts 16 --sampled-fraction 0 --dtype float32 --feature-dtype bfloat16 \
  --feature-cache "$out/features" --no-progress

# ----- train: grid.sh skips finished runs and resumes the unfinished one from its last checkpoint -----
stamp "train: $runs"
run env SCALE=cpu STAGE=train COPY_NGRAM=0 RUNS="$runs" FEATURE_CACHE="$out/features" PYTHON="$py" \
  DATA="data/smollm2-135m/long-v1 $out/data-long data/smollm2-135m/train-v3" \
  bash experiments/kinds/grid.sh "$out/grid"

# ----- bench: every drafter replayed on the ctx sets; --resume runs only what results.json lacks -----
drafters=()
for r in $runs; do drafters+=(--drafter "$r=$out/grid/runs/$r/drafter"); done
stamp "bench (replay): $(( ${#drafters[@]} / 2 )) drafters"
run "$py" -m hyflash.cli bench --model smollm2-135m --dtype float32 --no-adaptive --replay --temperatures 0 \
  --sets ctx-1k,ctx-2k,ctx-4k,ctx-6k,ctx-8k --n "$bench_n" --max-new-tokens "$bench_new" --methods plain \
  "${drafters[@]}" --memory-contexts 1024,2048,4096,6144,8192 --sweep-kinds '' --seed 0 --threads 2 \
  --out "$out/bench" --resume

# ----- summary -----
stamp summary
run "$py" experiments/kinds/summarize_nocopy.py "$out/bench" --out "$out" \
  --anchor-context "$out/grid/anchor_context.json"
