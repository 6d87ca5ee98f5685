#!/usr/bin/env bash
# Issue 13: does the same drafter accept as well on llama.cpp features as on transformers features?
# Every draft is verified in full (--no-adaptive), so tau measures the drafter and not the policy (on llama.cpp
# the adaptive policy shortens drafts, which lowers tau by itself). Greedy, 6 prompts x 3 sets, 64 tokens.
# Run from the repository root under ../shared/bin/heavy; extra drafters: DRAFTERS="name=path ...".
set -euo pipefail
out=${BENCH_OUT:-experiments/backends}
drafters=(--drafter default=hyflash/assets/drafters/smollm2-135m)  # a path: "default" names no drafter for a local .gguf
for d in ${DRAFTERS:-}; do drafters+=(--drafter "$d"); done
common=(--no-adaptive --sets chat,humaneval,code --n "${N:-6}" --max-new-tokens 64 --temperatures 0 --methods plain
        --trees 0 --memory-contexts '' --threads 2 "${drafters[@]}")
f16=${F16_GGUF:-cache/smollm2-135m-f16.gguf}
[ -f "$f16" ] || .venv/bin/python experiments/drafter-v2/make_f16.py "$f16" > /dev/null 2>&1
.venv/bin/hyflash bench --dtype float32 "${common[@]}" --out "$out/transformers-fp32"
.venv/bin/hyflash bench --dtype bfloat16 "${common[@]}" --out "$out/transformers-bf16"
.venv/bin/hyflash bench --backend llama.cpp "${common[@]}" --out "$out/llamacpp-q4_1"
.venv/bin/hyflash bench --backend llama.cpp --model "$f16" "${common[@]}" --out "$out/llamacpp-f16"
.venv/bin/python experiments/backends/summarize.py "$out"
