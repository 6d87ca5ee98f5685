"""The shipped Qwen drafter's chat-wild acceptance with its LM head taken from the GGUF's Q4_K token embedding
instead of its Q6_K output.weight: before 2026-12-07 `LlamaCppTarget._weight` made the embedding the head as soon
as anything embedded a token, so training (whose first forward embeds before its head reads) saw the embedding
while inference (the int8 copy, made at load) reads output.weight. Run from the repository root:

    ../shared/bin/heavy .venv/bin/python experiments/qwen/chat-wild-head-and-vocab/embed_head.py OUT
"""

import sys

from hyflash.cli import main
from hyflash.targets.llamacpp import LlamaCppTarget

LlamaCppTarget.head_weight = lambda self: self._weight("embed")
sys.exit(main(["bench", "--backend", "llama.cpp", "--model", "qwen2.5-coder-1.5b", "--no-adaptive", "--methods",
               "plain", "--drafter", "embedhead=hyflash/assets/drafters/qwen2.5-coder-1.5b", "--sets", "chat-wild",
               "--n", "12", "--max-new-tokens", "96", "--temperatures", "0", "--memory-contexts", "",
               "--sweep-kinds", "", "--threads", "2", "--out", sys.argv[1]]))
