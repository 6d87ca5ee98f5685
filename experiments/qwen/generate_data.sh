#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B training data on llama.cpp (issue 37 item 3/4), in slices of at most SLICE seconds of
# heavy-queue time each, so that other heavy jobs get the CPU between slices. `hyflash data` resumes a folder
# shard by shard (checksummed), so killing a slice loses at most the shard in progress; rerunning this script
# continues where it stopped. Run from the repository root:
#   nohup bash experiments/qwen/generate_data.sh >> experiments/qwen/generate_data.log 2>&1 &
# Settings: 2,400 varied train prompts, one long (2.3k-4.6k-token) prefix per 32 prompts: at most 458k
# target-written tokens, ~14% of all tokens in sequences of 2,048+ tokens (counted before generation with the
# target's tokenizer; see README.md).
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-/work/main/.venv/bin/python}
HEAVY=${HEAVY:-/work/shared/bin/heavy}
OUT=${OUT:-data/qwen2.5-coder-1.5b/train-varied}
FEATURES=${FEATURES:-/work/cache/features}
NUM_PROMPTS=${NUM_PROMPTS:-2400}
SLICE=${SLICE:-1200}
MAX_SLICES=${MAX_SLICES:-0}  # 0 = until the folder is complete
export PYTHONPATH=$PWD
complete() {
  "$PY" -c "import json,sys; sys.exit(0 if json.load(open('$OUT/manifest.json')).get('complete') else 1)" 2>/dev/null
}
failures=0 slices=0
until complete; do
  [ "$MAX_SLICES" -gt 0 ] && [ $slices -ge "$MAX_SLICES" ] && { echo "== $slices slice(s) done"; exit 0; }
  slices=$((slices + 1))
  echo "== slice start $(date -u +%FT%TZ)"
  # heavy outside timeout: the slice's clock starts once it holds the CPU, not while it queues.
  "$HEAVY" timeout "$SLICE" "$PY" -c 'import sys; from hyflash.cli import main; sys.exit(main())' data \
    --backend llama.cpp --model qwen2.5-coder-1.5b --source varied --split train --num-prompts "$NUM_PROMPTS" \
    --long-every 32 --shard-prompts 64 --out "$OUT" --feature-cache "$FEATURES" --no-progress
  rc=$?
  echo "== slice end $(date -u +%FT%TZ) rc=$rc"
  if [ $rc -ne 0 ] && [ $rc -ne 124 ]; then
    failures=$((failures + 1))
    [ $failures -ge 3 ] && { echo "== three failed slices in a row: stopping"; exit 1; }
  else
    failures=0
  fi
done
echo "== complete $(date -u +%FT%TZ)"
