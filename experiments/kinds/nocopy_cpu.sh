#!/usr/bin/env bash
# Issue 41 on a 2-core CPU: the kinds grid WITHOUT the copy input, over as many sessions as it takes, on machines
# that may be new at every session (nothing outside the checkout survives). What must last is committed as it is
# made; the weights and the feature cache, which cannot be, live in WORKDIR and are made again where they are gone:
#
#   UNTIL=09:20 ../shared/bin/heavy experiments/kinds/nocopy_cpu.sh /work/kinds-nocopy     a session (background it)
#   DRY_RUN=1 experiments/kinds/nocopy_cpu.sh /work/kinds-nocopy                           the commands, nothing run
#
# WORKDIR outside the checkout: a session may get a new checkout on the same machine, and the feature cache
# (~5 GB, ~85 min of float32 prefill to make again) then survives.
#   TINY=1 MODEL=DIR LONG_DATA=D RESULTS=R experiments/kinds/nocopy_cpu.sh W              every stage in seconds (tests)
#   git add data/smollm2-135m/long-v2 experiments/kinds/nocopy                            after it: what lasts
#
# UNTIL (HH:MM, UTC, today): when the session's CPU ends. No run starts that would not finish, with the bench
# after it, before then (RUN_MINUTES, minutes a run takes per drafter layer, 26: a depth-1 run took 25-26 min on a
# Zen 4 with the feature cache full, 2026-12-07; BENCH_MINUTES, 30); the data stage stops at it.
#
# Stages, each skipped once done:
#   data     NEW_LONG (192) more long target-written sequences (seed 2: other cut points than long-v1's seed 0;
#            16,000 characters like long-v1, ~4-5k tokens: training crops at 4,096; float32, which decodes long
#            prompts faster than bf16 here, docs/training.md section 5; 192 new tokens) into LONG_DATA
#            (data/smollm2-135m/long-v2, in the checkout: token ids, a few MB, resumable by shard). ~25-40 s a
#            prompt, 1.5-2 h in all. With long-v1 (112) and train-v3 (1,000 short sequences) about
#            (112 + 192) / 1,304 = 23% of training anchors have > 1,024 tokens of context (issue 41: >= 20%; the
#            measured share goes to RESULTS/anchor_context.json). No run trains before the data is complete: every
#            run of the grid sees the same data.
#   train    the grid's runs that no committed bench holds yet, one at a time through grid.sh (SCALE=cpu: 500 steps
#            x 8 sequences x 64 anchors, the copy grid's budget; COPY_NGRAM=0; AUTOCAST=off, so that runs made on
#            CPUs with and without native bf16 do the same arithmetic), the claims' pairs first; a run too long
#            for the time left waits while shorter ones after it go. On a new machine the first run also refills
#            the feature cache (~1.5M tokens of float32 prefill; its first epoch).
#            Each finished run's configs, curves and wall time are copied to RESULTS/runs/NAME (no weights).
#   bench    `hyflash bench --replay` of the runs trained here and not benched yet, into a new folder
#            RESULTS/bench-<UTC date and time, to the second> (committed; `.complete` once finished: an unfinished one is resumed
#            while its drafters' weights exist, and ignored once they are gone, whose runs then train again):
#            ctx-1k ... ctx-8k, 12 cut points each, 32 new tokens, greedy, float32; one recorded decode per prompt,
#            every drafter replayed against it (bench/replay.py), and the draft memory sweep at each context.
#            Training stops at 4,096 tokens, so ctx-6k and ctx-8k are the extrapolation sets. Benches of different
#            sessions pool (tau does not depend on the machine; each re-records the same greedy text).
#   summary  experiments/kinds/summarize_nocopy.py over every complete bench: claims (a)-(d) with the seed-spread
#            noise rule and a paired per-prompt bootstrap, beside the copy grid; draft memory and time per context;
#            the plot; into RESULTS.
#
# Environment: UNTIL, NEW_LONG (192), RUNS (the 12, in this order), BENCH_N (12), BENCH_NEW (32), BENCH_SETS
# (ctx-1k,...,ctx-8k), RUN_MINUTES (26 a layer), BENCH_MINUTES (30), LONG_DATA, RESULTS
# (experiments/kinds/nocopy), PYTHON, DRY_RUN; TINY=1 with MODEL (a tiny model folder), LONG_DATA and RESULTS
# outside the checkout: a tiny data set, SCALE=tiny trainings and a two-prompt bench, so that a test runs the real
# path end to end.
set -euo pipefail
die() { echo "nocopy_cpu: error: $*" >&2; exit 2; }
[ $# -eq 1 ] || die "usage: [UNTIL=HH:MM] experiments/kinds/nocopy_cpu.sh WORKDIR"
mkdir -p -- "$1" || die "cannot create WORKDIR '$1'"
work="$(cd -- "$1" && pwd)"
cd "$(dirname "$0")/../.."
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
dry="${DRY_RUN:-0}" run_minutes="${RUN_MINUTES:-26}" bench_minutes="${BENCH_MINUTES:-30}"
long_data="${LONG_DATA:-data/smollm2-135m/long-v2}" results="${RESULTS:-experiments/kinds/nocopy}"
bench_sets="${BENCH_SETS:-ctx-1k,ctx-2k,ctx-4k,ctx-6k,ctx-8k}"
if [ "${TINY:-0}" = 1 ]; then
  [ -n "${MODEL:-}" ] && [ -n "${LONG_DATA:-}" ] && [ -n "${RESULTS:-}" ] || die "TINY=1 needs MODEL, LONG_DATA and RESULTS"
  model=$MODEL scale=tiny new_long="${NEW_LONG:-4}" bench_n="${BENCH_N:-2}" bench_new="${BENCH_NEW:-4}"
  data="$long_data" mem_contexts=64,256
  data_args=(--long-chars 1200 --long-per-module 1 --long-batch-size 2 --long-new-tokens 8 --shard-prompts 2
             --source-root hyflash)
else
  model=smollm2-135m scale=cpu new_long="${NEW_LONG:-192}" bench_n="${BENCH_N:-12}" bench_new="${BENCH_NEW:-32}"
  data="data/smollm2-135m/long-v1 $long_data data/smollm2-135m/train-v3" mem_contexts=1024,2048,4096,6144,8192
  data_args=(--long-chars 16000 --long-per-module 4 --long-batch-size 1 --long-new-tokens 192 --shard-prompts 16)
fi
for v in new_long bench_n bench_new run_minutes bench_minutes; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "${v^^} must be a whole number >= 1"
done
until_s=""
if [ -n "${UNTIL:-}" ]; then
  [[ "$UNTIL" =~ ^([01][0-9]|2[0-3]):[0-5][0-9]$ ]] || die "UNTIL must be HH:MM (UTC, today), got '$UNTIL'"
  until_s=$(date -u -d "today $UNTIL" +%s)
fi
left_s() { if [ -z "$until_s" ]; then echo 999999999; else echo $(( until_s - $(date +%s) )); fi; }
runs="${RUNS:-hyflash-d1-s0 full-d1-s0 hyflash-d1-s1 full-d1-s1 hyflash-d2-s0 full-d2-s0 hyflash-d2-s1 full-d2-s1
      local-d1-s0 memory-d1-s0 local-d1-s1 memory-d1-s1}"
runs=$(echo $runs)
run() { echo "+ $*"; [ "$dry" = 1 ] || "$@"; }
stamp() { echo "== $1 ($(date -u +%H:%M:%S) UTC)"; }
grid_env=(SCALE="$scale" MODEL="$model" COPY_NGRAM=0 AUTOCAST=off FEATURE_CACHE="$work/features" PYTHON="$py" DATA="$data")
has_drafter() { [ -f "$work/grid/runs/$1/drafter/config.json" ]; }
# The runs a complete committed bench holds (their weights are no longer needed).
benched=" $("$py" - "$results" <<'EOF'
import json, sys
from pathlib import Path
names = set()
for path in Path(sys.argv[1]).glob("bench-*/results.json"):
    if (path.parent / ".complete").exists():
        names |= {r["method"] for r in json.loads(path.read_text())["runs"]}
print(" ".join(sorted(names)))
EOF
) "

# ----- data: in the checkout, resumable shards; features filed in WORKDIR as they are computed -----
data_done() { [ -f "$long_data/manifest.json" ] && "$py" - "$long_data/manifest.json" <<'EOF'
import json, sys
sys.exit(0 if json.load(open(sys.argv[1])).get("complete") else 1)
EOF
}
if [ "$dry" = 1 ] || ! data_done; then
  stamp "data: $new_long long prompts into $long_data"
  data_cmd=("$py" -m hyflash.cli data --out "$long_data" --model "$model" --seed 2 --kinds long --long-every 0
            --num-prompts "$new_long" "${data_args[@]}" --sampled-fraction 0 --dtype float32 --feature-dtype bfloat16
            --feature-cache "$work/features" --no-progress)
  if [ "$dry" = 1 ] || [ -z "$until_s" ]; then
    run "${data_cmd[@]}"
  else
    (( $(left_s) > 60 )) || { stamp "UNTIL reached before the data finished; run again next session"; exit 0; }
    rc=0; run timeout "$(left_s)" "${data_cmd[@]}" || rc=$?
    [ "$rc" = 124 ] && { stamp "UNTIL reached while the data was written (finished shards are kept); run again"; exit 0; }
    [ "$rc" = 0 ] || die "hyflash data failed (exit $rc)"
  fi
  [ "$dry" = 1 ] || data_done || die "$long_data is not complete after hyflash data; run again to resume it"
fi

# ----- train: one run at a time while the session has room for it and its bench -----
# Minutes the first run spends recording the features the cache lacks (every token of the training mix, float32:
# 259 tokens/s at 4,096 tokens of context on a Zen 4 with 2 threads, 2026-12-07; ~85 min for all 1.35M tokens).
refill_minutes() {
  "$py" - "$work/features" $data <<'EOF'
import sys
from pathlib import Path
from hyflash.training.data import TokenDataset  # its keys name the feature-cache files
have = {p.stem for p in Path(sys.argv[1]).glob("*/*.safetensors")}
data = TokenDataset(sys.argv[2:], verify=False)
print(round(sum(len(s) for s, key in zip(data.sequences, data.keys) if key not in have) / (259 * 60)))
EOF
}
stamp "train: $runs"
trained=()
refill=0
[ "$dry" = 1 ] || [ "${TINY:-0}" = 1 ] || refill=$(refill_minutes)
[ "$refill" -gt 0 ] && echo "== the feature cache lacks ~$refill min of float32 prefill: the first run records it first"
for name in $runs; do
  if [[ "$benched" == *" $name "* ]]; then echo "== $name: in a committed bench, skipped"; continue; fi
  depth=${name#*-d}; depth=${depth%%-*}  # a run's time grows with its drafter's layers
  [[ "$depth" =~ ^[1-9][0-9]*$ ]] || depth=1
  if [ "$dry" != 1 ] && ! has_drafter "$name" &&
     (( $(left_s) < (refill + depth * run_minutes + bench_minutes) * 60 )); then
    # A shallower run later in the order may still fit: the session's CPU is not left idle for a deep one.
    stamp "$name waits for the next session (~$(( refill + depth * run_minutes + bench_minutes )) min; UNTIL $UNTIL)"
    continue
  fi
  run env "${grid_env[@]}" STAGE=train RUNS="$name" bash experiments/kinds/grid.sh "$work/grid"
  refill=0
  if [ "$dry" = 1 ] || has_drafter "$name"; then
    trained+=("$name")
    if [ "$dry" != 1 ]; then
      mkdir -p "$results/runs/$name"
      for f in train_config.json drafter_config.json curves.png wall_seconds; do
        [ -f "$work/grid/runs/$name/$f" ] && cp "$work/grid/runs/$name/$f" "$results/runs/$name/"
      done
      cp "$work/grid/anchor_context.json" "$results/anchor_context.json" 2>/dev/null || true
    fi
  fi
done

# ----- bench: the runs trained here that no complete bench holds, into this session's folder -----
if [ ${#trained[@]} -gt 0 ]; then
  folder=""
  [ -f "$work/bench-folder" ] && [ ! -f "$(cat "$work/bench-folder")/.complete" ] && folder=$(cat "$work/bench-folder")
  folder="${folder:-$results/bench-$(date -u +%Y%m%d-%H%M%S)}"
  [ "$dry" = 1 ] || echo "$folder" > "$work/bench-folder"
  drafters=()
  for r in "${trained[@]}"; do drafters+=(--drafter "$r=$work/grid/runs/$r/drafter"); done
  stamp "bench (replay): ${#trained[@]} drafters into $folder"
  run "$py" -m hyflash.cli bench --model "$model" --dtype float32 --no-adaptive --replay --temperatures 0 \
    --sets "$bench_sets" --n "$bench_n" --max-new-tokens "$bench_new" --methods plain \
    "${drafters[@]}" --memory-contexts "$mem_contexts" --sweep-kinds '' --seed 0 --threads 2 \
    --out "$folder" --resume
  [ "$dry" = 1 ] || touch "$folder/.complete"
fi

# ----- summary over every complete bench -----
stamp summary
benches=()
for b in "$results"/bench-*/; do [ -f "$b/.complete" ] && benches+=("${b%/}"); done
if [ "$dry" = 1 ]; then
  run "$py" experiments/kinds/summarize_nocopy.py "$results/bench-*" --out "$results" \
    --anchor-context "$results/anchor_context.json"
elif [ ${#benches[@]} -gt 0 ]; then
  run "$py" experiments/kinds/summarize_nocopy.py "${benches[@]}" --out "$results" \
    --anchor-context "$results/anchor_context.json"
else
  echo "== no complete bench yet: nothing to summarise"
fi
