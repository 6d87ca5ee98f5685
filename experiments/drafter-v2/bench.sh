#!/usr/bin/env bash
# Issues 11, 13, 14 in one place, after training (run from the repository root under ../shared/bin/heavy):
#  A. transformers, float32 (greedy text must equal plain): the new drafter alone, as a chain and as trees of
#     4/8/16/32 nodes, against plain, n-gram and llama.cpp's own loops, on the bar's sets, greedy and T=1.
#  B. llama.cpp backend (the shipped Q4_1 GGUF): the same drafter on llama.cpp features, chain and tree 8.
#  C. the same on an F16 GGUF of the same weights (make_f16.py).
set -euo pipefail
drafter=${DRAFTER:-runs/drafter-v2/drafter}
out=${BENCH_OUT:-experiments/drafter-v2}
n=${N:-3}
.venv/bin/hyflash bench --dtype float32 --sets chat,humaneval,code,prose,long-4k --n "$n" --max-new-tokens 64 \
  --temperatures 0,1 --methods plain,ngram,llamacpp-plain,llamacpp-prompt-lookup --drafter "v2=$drafter" \
  --trees 0,4,8,16,32 --memory-contexts '' --threads 2 --out "$out/transformers-fp32"
.venv/bin/hyflash bench --backend llama.cpp --sets chat,humaneval,code,prose --n "$n" --max-new-tokens 64 \
  --temperatures 0,1 --methods plain,ngram,llamacpp-plain,llamacpp-prompt-lookup --drafter "v2=$drafter" \
  --trees 0,8 --memory-contexts '' --threads 2 --out "$out/llamacpp-q4_1"
f16=${F16_GGUF:-cache/smollm2-135m-f16.gguf}
.venv/bin/python experiments/drafter-v2/make_f16.py "$f16" > /dev/null 2>&1
.venv/bin/hyflash bench --backend llama.cpp --model "$f16" --sets chat,humaneval,code,prose --n "$n" --max-new-tokens 64 \
  --temperatures 0,1 --methods plain,ngram,llamacpp-plain,llamacpp-prompt-lookup --drafter "v2=$drafter" \
  --trees 0,8 --memory-contexts '' --threads 2 --out "$out/llamacpp-f16"
