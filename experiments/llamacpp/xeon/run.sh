#!/usr/bin/env bash
# Issue 13 on an Intel Xeon (AVX-512, AMX), 2026-12-02, after the 2,048-id head became the shipped drafter:
# the draft's share of a step on Q4_1 and F16 (draft_cost.py, with the 8,192-id head shipped before as a
# comparison), and the speed-up of `--drafter default` (hybrid) and of the drafter alone over llama-cpp-python's
# own loop on Q4_1 and F16 (retire/run.sh, the policy as shipped). Run from the repository root under
# ../shared/bin/heavy. OLD names a folder with the 8,192-id drafter (default runs/shipped-8192; make it with
# `git show 7f09aec:hyflash/assets/drafters/smollm2-135m/model.safetensors`, and its config.json, into it).
set -euo pipefail
here=experiments/llamacpp/xeon
old=${OLD:-runs/shipped-8192}
f16=${F16_GGUF:-cache/smollm2-135m-f16.gguf}
mkdir -p cache
.venv/bin/python experiments/drafter-v2/make_f16.py "$f16" > /dev/null
compare=()
[ -f "$old/config.json" ] && compare=(--compare "v2-8192=$old")
.venv/bin/python experiments/llamacpp/draft_cost.py --out $here "${compare[@]}"
.venv/bin/python experiments/llamacpp/draft_cost.py "$f16" --out $here "${compare[@]}"
ONLY_RETIRE=1 BENCH_OUT=$here/q4_1 bash experiments/llamacpp/retire/run.sh
ONLY_RETIRE=1 MODEL=$f16 BENCH_OUT=$here/f16 bash experiments/llamacpp/retire/run.sh
