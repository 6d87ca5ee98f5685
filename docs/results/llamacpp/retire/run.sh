#!/usr/bin/env bash
# The policy's retirement of a drafter that does not pay (policy.py, retire_after), on llama.cpp Q4_1 where a
# k-token pass costs nearly k steps: the same bench with and without --keep-drafter, back to back.
# `default` is the shipped drafter with the n-gram lookup (hybrid); `v2` the shipped drafter alone.
# Run from the repository root under ../shared/bin/heavy.
set -euo pipefail
out=${BENCH_OUT:-docs/results/llamacpp/retire}
common=(--backend llama.cpp --sets chat,humaneval,code --n "${N:-6}" --max-new-tokens 128 --temperatures 0
        --methods plain,ngram,llamacpp-plain --trees 0 --memory-contexts '' --threads 2
        --drafter default --drafter v2=hyflash/assets/drafters/smollm2-135m)
[ -n "${ONLY_KEEP:-}" ] || .venv/bin/hyflash bench "${common[@]}" --out "$out/retire"
[ -n "${ONLY_RETIRE:-}" ] || .venv/bin/hyflash bench "${common[@]}" --keep-drafter --out "$out/keep"
