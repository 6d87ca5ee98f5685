"""What share of the target's greedy tokens the shipped Qwen drafter's draft vocabulary (its most frequent ids
first) covers, at 256 ... 2,048 ids, in committed acceptance runs. Run from the repository root:

    python experiments/qwen/chat-wild-head-and-vocab/coverage.py experiments/qwen/acceptance-chat-wild experiments/qwen/acceptance-sets
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

from safetensors import safe_open

DRAFTER = "hyflash/assets/drafters/qwen2.5-coder-1.5b/model.safetensors"
ids = safe_open(DRAFTER, "pt").get_tensor("draft_vocab_ids").tolist()
SIZES = (256, 512, 1024, 2048)
vocabularies = [set(ids[:n]) for n in SIZES]  # the most frequent n ids
for folder in sys.argv[1:]:
    runs = json.loads((Path(folder) / "results.json").read_text())["runs"]
    method = "plain" if any(r["method"] == "plain" for r in runs) else runs[0]["method"]  # the texts it decoded
    tokens = defaultdict(list)
    for run in runs:
        if run["method"] == method:
            tokens[run["set"]] += run["tokens"]
    for name, toks in tokens.items():
        shares = [sum(t in vocabulary for t in toks) / len(toks) for vocabulary in vocabularies]
        print(f"{name:10s} {len(toks):6d} tokens  coverage at 256 / 512 / 1,024 / 2,048 ids: "
              + " / ".join(f"{s:.3f}" for s in shares))
