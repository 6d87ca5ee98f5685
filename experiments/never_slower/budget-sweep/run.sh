#!/usr/bin/env bash
# Issue 36: the guard's loss budget swept on the replay (fake clock), suite prompts and training continuations.
cd "$(dirname "$0")/../../.."
for backend in llama.cpp transformers; do
  curve=runs/ns-zen4-llama-3/llama.cpp/results.json
  [ $backend = transformers ] && curve=runs/ns-zen4-tf/transformers/results.json
  for b in 0.02 0.01 0.005; do
    for st in 64 32; do
      for src in "--suite $curve" "--suite $curve --carry" "--data data/smollm2-135m/train-v3 --max 100"; do
        echo "### $backend budget $b start $st $src"
        OMP_NUM_THREADS=1 .venv/bin/python -m experiments.never_slower.replay --curve $curve $src --priors measured-12 \
          --loss-budget $b --start-tokens $st --worst 5
      done
    done
  done
done
