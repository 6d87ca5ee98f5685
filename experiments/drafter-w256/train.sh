#!/usr/bin/env bash
# Issue 11, lever "a wider trained window": drafter v2 (8,192-id draft vocabulary, trained with a 64-token
# window; shipped until 2026-12-02, when its 2,048-id trim replaced it) trained on with a 256-token attention
# window, so that it can learn to copy from the prompt (held-out chat answers copy the function they were asked
# to complete; the n-gram lookup beats the drafter there). The weights do not depend on the window (RoPE is
# relative), so the run starts from a copy of v2 whose config says window 256; v2 is read from the commit that
# shipped it (FROM_COMMIT). Same data and recipe as experiments/drafter-v2/train.sh, features computed on the
# fly (one epoch is not reached: no cache). Resumable: rerun with --resume. Run from the repository root under
# ../shared/bin/heavy.
set -euo pipefail
init=runs/init-w256
v2=hyflash/assets/drafters/smollm2-135m
if [ ! -f "$init/config.json" ]; then
  mkdir -p "$init"
  git show "${FROM_COMMIT:-7f09aec}:$v2/model.safetensors" > "$init/model.safetensors"
  git show "${FROM_COMMIT:-7f09aec}:$v2/config.json" | .venv/bin/python -c "import json, sys; c = json.load(sys.stdin); \
c['window'] = 256; json.dump(c, open(sys.argv[1], 'w'), indent=2)" "$init/config.json"
fi
.venv/bin/hyflash train --data data/smollm2-135m/train-v2 data/smollm2-135m/long-v1 data/smollm2-135m/train-v3 \
  --init "$init" --out "${OUT:-runs/drafter-w256}" \
  --steps "${STEPS:-1100}" --batch-size 8 --anchors 64 --lr 1e-3 --warmup-steps 30 --gamma 4 --max-length 4096 \
  --save-every 50 --log-every 10 --eval-at 1,300,700 --eval-prompts 12 --eval-new-tokens 96 --threads 2 \
  --no-progress "$@"
