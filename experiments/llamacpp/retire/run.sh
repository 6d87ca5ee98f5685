#!/usr/bin/env bash
# The policy's retirement of a drafter that does not pay (policy.py, retire_after), on llama.cpp Q4_1 where a
# k-token pass costs nearly k steps: the same bench with and without --keep-drafter, back to back.
# `default` is the shipped drafter with the n-gram lookup (hybrid); `v2` the shipped drafter alone.
# MODEL=PATH.gguf benches another file (e.g. the F16 one from experiments/drafter-v2/make_f16.py) with v2
# alone: for a local file `default` names no shipped drafter. ONLY_RETIRE=1 / ONLY_KEEP=1 run one half.
# EXTRA="--cache-type-k f16" adds bench options (here: llama.cpp's own default KV cache instead of ours).
# Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
out=${BENCH_OUT:-experiments/llamacpp/retire}
drafters=(--drafter default --drafter v2=hyflash/assets/drafters/smollm2-135m)
model=()
if [ -n "${MODEL:-}" ]; then
  model=(--model "$MODEL")
  drafters=(--drafter v2=hyflash/assets/drafters/smollm2-135m)
fi
common=(--backend llama.cpp "${model[@]}" --sets chat,humaneval,code --n "${N:-6}" --max-new-tokens 128
        --temperatures 0 --methods plain,ngram,llamacpp-plain --trees 0 --memory-contexts '' --threads 2
        "${drafters[@]}")
read -r -a extra <<< "${EXTRA:-}"
common+=("${extra[@]}")
[ -n "${ONLY_KEEP:-}" ] || .venv/bin/hyflash bench "${common[@]}" --out "$out/retire"
[ -n "${ONLY_RETIRE:-}" ] || .venv/bin/hyflash bench "${common[@]}" --keep-drafter --out "$out/keep"
