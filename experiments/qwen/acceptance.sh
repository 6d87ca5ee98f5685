#!/usr/bin/env bash
# Issue 37: drafters scored on llama.cpp with every draft verified (--no-adaptive, so the policy's choice does not
# hide what they would be accepted at), greedy, 96 new tokens. The settings every acceptance run here shares;
# the methods, drafters and threads come after:
#   bash experiments/qwen/acceptance.sh OUT SETS N [more hyflash bench flags, e.g. --methods ngram --drafter A=DIR]
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: acceptance.sh OUT SETS N [hyflash bench flags]" >&2; exit 2; }
cd "$(dirname "$0")/../.."
out=$1 sets=$2 n=$3
shift 3
"${PY:-.venv/bin/python}" -m hyflash.cli bench --backend llama.cpp --model qwen2.5-coder-1.5b --no-adaptive \
  --sets "$sets" --n "$n" --max-new-tokens 96 --temperatures 0 --memory-contexts '' --sweep-kinds '' \
  --out "$out" "$@"
