#!/usr/bin/env bash
# Issue 37 item 4: the HyFlash drafter for qwen2.5-coder-1.5b, trained on its own llama.cpp-written data with the
# features llama.cpp recorded while writing it (so training features are inference features). The SmolLM2
# recipe (docs/training.md: one layer, window 256, gated-delta memory, block 8, copy input N = 16 with its gate,
# CE with exp slot weights gamma 4, 8 sequences x 64 anchors) at a width of its own: 512 (--hidden-size; the
# target's 1536 would make it 47M parameters, 95 MB; at 512 it is 9.8M, 19.6 MB in bf16, under the issue's
# 25 MB), draft vocabulary 2,048 ids (DRAFT_VOCAB; the head's rows are the target's, so a larger one adds only its
# ids to the file; on chat-wild halving it moved tau 1.81 -> 1.79: experiments/qwen/chat-wild-head-and-vocab/).
# Resumable: rerun with --resume. Run from the repository root:
#   /work/shared/bin/heavy bash experiments/qwen/train.sh [--resume] [more hyflash train flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
PY=${PY:-/work/main/.venv/bin/python}  # DATA may name several folders (space-separated)
# A new drafter gets its width and draft vocabulary here; an --init drafter keeps its own (hyflash train refuses both).
shape=(--hidden-size "${WIDTH:-512}" --draft-vocab-size "${DRAFT_VOCAB:-2048}")
for arg in "$@"; do [ "$arg" = --init ] && shape=(); done
"$PY" -c 'import sys; from hyflash.cli import main; sys.exit(main())' train \
  --model qwen2.5-coder-1.5b --feature-backend llama.cpp --feature-cache "${FEATURES:-/work/cache/features}" \
  --data ${DATA:-data/qwen2.5-coder-1.5b/train-varied} --out "${OUT:-runs/qwen-drafter}" \
  --kind hyflash --num-layers 1 --block-size 8 --window 256 --chunk-size 16 --memory-rule gated_delta \
  ${shape[@]+"${shape[@]}"} --copy-ngram 16 --copy-gate \
  --steps "${STEPS:-1500}" --batch-size 8 --anchors 64 --lr 1e-3 --warmup-steps 50 --gamma 4 --max-length 4096 \
  --save-every 25 --log-every 5 --eval-at "${EVAL_AT:-1,500,1000,1500}" --eval-prompts 12 --eval-new-tokens 96 \
  --threads 2 --no-progress "$@"
