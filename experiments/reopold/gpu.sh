#!/usr/bin/env bash
# The decisive REOPOLD experiment (docs/reopold.md) at the gpu scale: one CUDA device, sized for an H200 to
# finish the whole grid in under 9 minutes. Run it again with the same OUTDIR to resume a stopped run.
#
#   experiments/reopold/gpu.sh OUTDIR
set -euo pipefail
out="${1:?usage: experiments/reopold/gpu.sh OUTDIR}"
cd "$(dirname "$0")/../.."
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
mkdir -p "$out"
# A CUDA smoke test first (the tiny scale on the device, seconds), so a broken CUDA path fails here and not
# minutes into the real run.
"$py" -m experiments.reopold --out "$out/cuda-smoke" --scale tiny --device cuda --no-progress > /dev/null
"$py" -m experiments.reopold --out "$out" --scale gpu
