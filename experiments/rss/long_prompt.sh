#!/usr/bin/env bash
# Peak RSS of `hyflash generate` on a ~7.5k-token prompt (4 new tokens): the issue-16 bar is 1.5 GB.
# Writes experiments/rss/long_prompt.{json,md}. Run through ../shared/bin/heavy on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=experiments/rss
prompt=$(.venv/bin/python - <<'PY'
from hyflash.bench.datasets import heldout_stdlib_modules, _read_module
texts = [t for t in (_read_module(m) for m in heldout_stdlib_modules()) if t and len(t) > 30000]
print(texts[0][:26000])
PY
)
rows=()
for drafter in none default; do
  for dtype in float32 bfloat16; do
    /usr/bin/time -v .venv/bin/hyflash generate --no-chat --max-new-tokens 4 --drafter $drafter --dtype $dtype \
      --json --prompt "$prompt" > /tmp/rss_gen.json 2> /tmp/rss_time.txt
    kb=$(grep "Maximum resident set size" /tmp/rss_time.txt | awk '{print $NF}')
    tokens=$(.venv/bin/python -c "import json; print(json.load(open('/tmp/rss_gen.json'))['prompt_tokens'])")
    rows+=("{\"drafter\": \"$drafter\", \"dtype\": \"$dtype\", \"prompt_tokens\": $tokens, \"peak_rss_bytes\": $((kb * 1024))}")
  done
done
cpu=$(lscpu | grep "Model name" | sed 's/.*: *//')
printf '{"cpu": "%s", "command": "experiments/rss/long_prompt.sh", "runs": [%s]}\n' "$cpu" "$(IFS=,; echo "${rows[*]}")" > $out/long_prompt.json
.venv/bin/python - <<'PY'
import json
d = json.load(open("experiments/rss/long_prompt.json"))
lines = [f"Command: `{d['command']}` on {d['cpu']}", "", "| drafter | dtype | prompt tokens | peak RSS |", "|---|---|---:|---:|"]
lines += [f"| {r['drafter']} | {r['dtype']} | {r['prompt_tokens']} | {r['peak_rss_bytes'] / 2**30:.2f} GiB |" for r in d["runs"]]
open("experiments/rss/long_prompt.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
