#!/usr/bin/env bash
# Issue 36: does a policy carried from prompt to prompt (the bench, the server) lose where it trusts what earlier
# prompts taught it? The replay (fake clock) with a share of the calibrator's counts dropped before each
# generation (--forget), against a fresh policy per generation (as `hyflash generate` has).
cd "$(dirname "$0")/../../.."
for backend in llama.cpp transformers; do
  curve=runs/ns-zen4-llama-4/llama.cpp/results.json
  [ $backend = transformers ] && curve=runs/ns-zen4-tf/transformers/results.json
  for src in "--suite $curve" "--data data/smollm2-135m/train-v3 --max 100"; do
    echo "### $backend fresh $src"
    OMP_NUM_THREADS=1 .venv/bin/python -m experiments.never_slower.replay --curve $curve $src --priors measured-12 --worst 5
    for f in 0 0.5 0.9 1; do
      echo "### $backend carried, forget $f $src"
      OMP_NUM_THREADS=1 .venv/bin/python -m experiments.never_slower.replay --curve $curve $src --priors measured-12 \
        --carry --forget $f --worst 5
    done
  done
done
