"""How often does greedy speculative text on llama.cpp differ from plain greedy text of the same file? (Issue 39, 9.)

    ../shared/bin/heavy .venv/bin/python experiments/llamacpp/greedy-exactness/greedy_exactness.py [MODEL ...]

For each model (default: qwen2.5-coder-1.5b, a Q4_K_M file, and smollm2-135m, the shipped Q4_1), the first N
prompts of the humaneval and chat sets (chat template) are decoded greedily for 128 tokens with `--drafter none`
and with `--drafter ngram --no-adaptive` (every draft verified in full: the most multi-token passes, so the most
chances to round differently), the target's default settings (`--cache-type-k auto`). Reports per prompt whether
the texts are identical and where they first differ. Writes greedy_exactness.{json,md} next to this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hyflash import engine
from hyflash.bench.datasets import load_set
from hyflash.decoding import generate
from hyflash.files import atomic_write_json, atomic_write_text
from hyflash.machine import cpu_description

HERE = Path(__file__).resolve().parent
SETS, N, NEW = ("humaneval", "chat"), 4, 128


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def measure(model: str) -> dict:
    target, drafter, policy, _ = engine.load(model, "auto", "ngram", adaptive=False, backend="llama.cpp",
                                             log=lambda line: None)
    rows = []
    for name in SETS:
        for prompt in load_set(name, target, N, NEW):
            plain = generate(target, list(prompt.ids), None, max_new_tokens=NEW)
            spec = generate(target, list(prompt.ids), drafter, max_new_tokens=NEW, policy=policy)
            rows.append({"set": name, "item": prompt.item_id, "tokens": len(plain.tokens), "tau": spec.tau,
                         "first_difference": first_difference(plain.tokens, spec.tokens)})
            print(model, rows[-1], flush=True)
    return {"model": model, "file": Path(getattr(target, "path", "") or model).name,
            "cache_types": getattr(target, "cache_types", None), "rows": rows}


def markdown(result: dict) -> str:
    lines = [f"# Greedy speculative vs plain text on llama.cpp ({result['cpu']})", "",
             f"`{result['command']}`: {N} prompts each of {', '.join(SETS)}, {NEW} new tokens, n-gram drafter "
             "verified in full (`--no-adaptive`) vs `--drafter none`, default cache types.", "",
             "| model | file | prompts identical | first differences (token index) | mean τ |", "|---|---|---:|---|---:|"]
    for m in result["models"]:
        diffs = [r["first_difference"] for r in m["rows"]]
        same = sum(d is None for d in diffs)
        tau = sum(r["tau"] for r in m["rows"]) / len(m["rows"])
        shown = ", ".join(str(d) for d in diffs if d is not None) or "–"
        lines.append(f"| {m['model']} | {m['file']} | {same} / {len(diffs)} | {shown} | {tau:.2f} |")
    return "\n".join(lines) + "\n"


def main(models: list[str]) -> None:
    result = {"cpu": cpu_description()[0], "command": " ".join(["greedy_exactness.py", *models]),
              "models": [measure(m) for m in models]}
    atomic_write_json(HERE / "greedy_exactness.json", result)
    atomic_write_text(HERE / "greedy_exactness.md", markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main(sys.argv[1:] or ["qwen2.5-coder-1.5b", "smollm2-135m"])
