"""Is a q-token llama.cpp pass bit-identical to q one-token passes? (Why greedy identity can fail on llama.cpp.)

    ../shared/bin/heavy .venv/bin/python experiments/llamacpp/batch_invariance.py [GGUF ...]

For each file (default: the shipped SmolLM2 Q4_1, and cache/smollm2-135m-f16.gguf when present), llama.cpp
on 1 and 2 threads, flash attention on and off, and 90 / 300 / 600 / 1000 tokens of context (a slice of hyflash's own source): decode
16 greedy tokens one pass per token, then roll back and score the same 16 tokens in blocks of q = 2, 8, 16.
Reports the largest logit difference between the two and how many argmaxes flip. Writes
batch_invariance.json and batch_invariance.md next to this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from hyflash.machine import cpu_description
from hyflash.targets.llamacpp import LlamaCppTarget, gguf_path, matmul_kernels

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CONTEXTS = (90, 300, 600, 1000)
QS = (2, 8, 16)
NEW = 16


def result_stem(name: str, path: Path | None) -> str:
    """The file stem the llamacpp/ scripts write their results under: `name`, `-<GGUF stem>` for a file other
    than the shipped one, and `-no-llamafile` on a llama.cpp built without llamafile's sgemm (as `make venv`
    builds it), so that results of the two builds sit side by side."""
    stem = name if path is None else f"{name}-{path.stem}"
    return stem + ("-no-llamafile" if matmul_kernels() == "ggml" else "")


def measure(path: Path, threads: int, flash_attn: bool, contexts=CONTEXTS, cache_type_k: str = "f16",
            cache_type_v: str = "f16") -> list[dict]:
    """Rows of one setting. The KV cache defaults to llama.cpp's own F16/F16, as the table below was measured
    (kv_cache.py compares the other types)."""
    target = LlamaCppTarget(path, n_threads=threads, flash_attn=flash_attn, cache_type_k=cache_type_k,
                            cache_type_v=cache_type_v)
    ids = target.tokenizer.encode((ROOT / "hyflash" / "decoding.py").read_text()[:6000])
    rows = []
    for ctx in contexts:
        out = target.prefill(torch.tensor(ids[:ctx]), features=False)
        block, one_token = [], []
        nxt = int(out.logits[-1].argmax())
        for _ in range(NEW):
            block.append(nxt)
            logits = target.score(torch.tensor([nxt]), features=False).logits[-1]
            one_token.append(logits)
            nxt = int(logits.argmax())
        reference = torch.stack(one_token)
        row = {"file": path.name, "threads": threads, "flash_attn": flash_attn, "context": ctx,
               "cache_types": [cache_type_k, cache_type_v]}
        for q in QS:
            target.rollback(ctx)
            batched = torch.cat([target.score(torch.tensor(block[s : s + q]), features=True).logits
                                 for s in range(0, NEW, q)])
            row[f"q{q}_max_diff"] = float((batched - reference).abs().max())
            row[f"q{q}_flips"] = int((batched.argmax(-1) != reference.argmax(-1)).sum())
        rows.append(row)
        print(row, flush=True)
    return rows


def main(paths: list[Path]) -> None:
    rows = [r for p in paths for threads in (1, 2) for fa in (True, False) for r in measure(p, threads, fa)]
    cpu = cpu_description()[0]
    (HERE / "batch_invariance.json").write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1))
    head = "| file | threads | flash attn | context | " + " | ".join(f"q={q}: max Δlogit (flips)" for q in QS) + " |"
    lines = [f"# Batch invariance of llama.cpp passes ({cpu})", "",
             "`experiments/llamacpp/batch_invariance.py`: logits of 16 greedy tokens scored in q-token passes vs",
             "one-token passes (what plain decoding runs), after the same prefill. 0 = bit-identical. KV cache",
             "F16/F16 (llama.cpp's default; hyflash's on Q4_1 is q8_0 K, see kv_cache.md).", "",
             head, "|---|---:|---|---:|" + "---:|" * len(QS)]
    for r in rows:
        cells = " | ".join(f"{r[f'q{q}_max_diff']:.2g} ({r[f'q{q}_flips']})" for q in QS)
        lines.append(f"| {r['file']} | {r['threads']} | {'on' if r['flash_attn'] else 'off'} | {r['context']} | {cells} |")
    (HERE / "batch_invariance.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]]
    if not args:
        args = [gguf_path("smollm2-135m")]
        if (ROOT / "cache" / "smollm2-135m-f16.gguf").exists():
            args.append(ROOT / "cache" / "smollm2-135m-f16.gguf")
    main(args)
