#!/usr/bin/env bash
# Issue 11, recipe levers: one short run per lever at equal steps (200 steps x 8 sequences x 64 anchors, the
# same data order), each scored by held-out tau (real greedy speculative decoding, 12 held-out chat prompts,
# 96 new tokens, bf16). Resumable: a finished run is skipped, a killed one resumes from its checkpoint.
# Run from the repository root: ../shared/bin/heavy experiments/recipe/sweep.sh
set -euo pipefail
out=${RECIPE_OUT:-runs/recipe}
common=(--data data/smollm2-135m/train-v2 --feature-cache cache/features --steps 200 --batch-size 8
        --anchors 64 --lr 1.5e-3 --warmup-steps 20 --gamma 4 --save-every 50 --log-every 10
        --eval-every 0 --eval-prompts 12 --eval-new-tokens 96 --no-progress --threads 2)
declare -A lever=(
  [base]=""
  [kl]="--loss kl"
  [init-target]="--init-from-target"
  [depth2]="--num-layers 2"
  [block16]="--block-size 16 --gamma 7"
  [survival]="--slot-weights survival"
  [vocab8k]="--draft-vocab-size 8192"
  [window256]="--window 256"
)
# LEVERS picks runs; kl is left out by default: it costs ~4x per step (a teacher pass every step, because
# the feature cache cannot serve the target's logits), so at equal compute it sees a quarter of the data.
for name in ${LEVERS:-base window256 init-target depth2 survival block16}; do
  dir=$out/$name
  if [ -f "$dir/drafter/model.safetensors" ] && grep -q '"eval"' "$dir/log.jsonl" 2>/dev/null; then
    echo "== $name: done"; continue
  fi
  resume=(); [ -d "$dir/checkpoints" ] && resume=(--resume)
  echo "== $name: ${lever[$name]} ($(date -u +%H:%M:%S))"
  start=$(date +%s)
  # shellcheck disable=SC2086
  .venv/bin/hyflash train "${common[@]}" --draft-vocab-size 16384 ${lever[$name]} --out "$dir" "${resume[@]}"
  echo "$(( $(date +%s) - start ))" > "$dir/wall_seconds"
done
.venv/bin/python experiments/recipe/summarize.py "$out"
