"""llama.cpp target vs transformers target on this machine: cached pass cost and plain greedy decode speed.

    ../shared/bin/heavy .venv/bin/python experiments/llamacpp/measure.py

Writes measure.json and measure.md next to this file. Pass cost: one cached `score` of q tokens at 256 tokens
of context, features on (as in speculative decoding), median of 7. Decode: plain greedy `generate` over 64
new tokens (no EOS stop), tokens / decode time, best of 2. Reference: llama-cpp-python's own loop
(`Llama.generate`, temperature 0) on the same GGUF with the same threads and flash-attention setting; and our
plain decoding on a target built with record_features=False (no eval callback).
Extra: tau of the shipped drafter on both backends (2 prompts x 64 tokens, greedy; a small sample).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from hyflash.machine import physical_cores
from hyflash.decoding import generate
from hyflash.targets import load_target

HERE = Path(__file__).resolve().parent
QS = (1, 2, 4, 8, 16)
CONTEXT = 256
NEW = 64
PROMPTS = ["Write a Python function that reverses a string.", "Explain photosynthesis in two sentences."]


def pass_costs(target, features: bool = True, reps: int = 7) -> dict[int, float]:
    ids = torch.randint(0, target.vocab_size, (CONTEXT + max(QS),), generator=torch.Generator().manual_seed(0))
    target.prefill(ids[:CONTEXT], features=False)
    target.score(ids[CONTEXT : CONTEXT + 2], features=features)  # warm-up
    target.rollback(CONTEXT)
    out = {}
    for q in QS:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            target.score(ids[CONTEXT : CONTEXT + q], features=features)
            times.append((time.perf_counter() - t0) * 1000)
            target.rollback(CONTEXT)
        out[q] = statistics.median(times)
    target.reset()
    return out


def decode_speed(target) -> float:
    ids = target.encode_prompt(PROMPTS[0])
    return max(generate(target, ids, None, max_new_tokens=NEW, stop_at_eos=False).tokens_per_second
               for _ in range(2))


def llama_cpp_own_speed(target) -> float:
    from hyflash.targets.llamacpp import llama_cpp_peer

    llm = llama_cpp_peer(target.path, target, n_ctx=2048)
    ids = target.encode_prompt(PROMPTS[0])
    best = 0.0
    for _ in range(2):
        n, t_first = 0, 0.0
        for _tok in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            n += 1
            if n == 1:
                t_first = time.perf_counter()
            if n >= NEW:
                break
        # Same definition as GenerationResult.tokens_per_second: new tokens over the time after the first.
        best = max(best, n / (time.perf_counter() - t_first))
        llm.reset()
    return best


def drafter_tau(target) -> float:
    from hyflash.drafters.loading import load_drafter_for_target
    from hyflash.training.defaults import default_drafter_path

    drafter = load_drafter_for_target(default_drafter_path("smollm2-135m"), target)
    taus = [generate(target, target.encode_prompt(p), drafter, max_new_tokens=NEW).tau for p in PROMPTS]
    return sum(taus) / len(taus)


def main() -> None:
    threads = physical_cores()
    torch.set_num_threads(threads)
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "?")
    from hyflash.targets.llamacpp import LlamaCppTarget

    rows = []
    for label, backend, dtype, kwargs in [
        ("llama.cpp Q4_1, flash-attn on (default)", "llama.cpp", "auto", {"flash_attn": True}),
        ("llama.cpp Q4_1, flash-attn off", "llama.cpp", "auto", {"flash_attn": False}),
        ("transformers float32", "transformers", "float32", None),
        ("transformers bfloat16", "transformers", "bfloat16", None),
    ]:
        target = load_target("smollm2-135m", dtype, backend) if kwargs is None else \
            LlamaCppTarget.load("smollm2-135m", **kwargs)
        row = {"target": label, "backend": backend, "pass_ms": pass_costs(target),
               "decode_tok_s": decode_speed(target), "drafter_tau": drafter_tau(target)}
        if backend == "llama.cpp":
            row["pass_ms_no_features"] = pass_costs(target, features=False)
            row["llama_cpp_python_tok_s"] = llama_cpp_own_speed(target)
            del target  # one llama.cpp context at a time
            plain = LlamaCppTarget.load("smollm2-135m", record_features=False, **kwargs)
            row["decode_tok_s_no_callback"] = decode_speed(plain)
            del plain
        else:
            del target
        rows.append(row)
        print(json.dumps(row), flush=True)

    meta = {"cpu": cpu, "threads": threads, "context": CONTEXT, "new_tokens": NEW, "torch": torch.__version__,
            "command": " ".join([sys.executable, *sys.argv])}
    (HERE / "measure.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [f"# llama.cpp vs transformers target: SmolLM2-135M on {cpu}, {threads} threads", "",
             f"`{Path(sys.argv[0]).as_posix()}` (see its docstring). Cached pass at {CONTEXT} tokens of context, "
             "features on, median ms (in plain steps); plain greedy decode over 64 tokens.", "",
             "| target | " + " | ".join(f"q={q}" for q in QS) + " | plain decode | plain decode, no eval "
             "callback | llama-cpp-python's own loop | shipped drafter tau |",
             "|---|" + "---|" * len(QS) + "---|---|---|---|"]
    for r in rows:
        base = r["pass_ms"][1]
        cells = [f"{r['pass_ms'][q]:.1f}" + ("" if q == 1 else f" ({r['pass_ms'][q] / base:.1f}x)") for q in QS]
        own = f"{r['llama_cpp_python_tok_s']:.1f} tok/s" if "llama_cpp_python_tok_s" in r else "-"
        bare = f"{r['decode_tok_s_no_callback']:.1f} tok/s" if "decode_tok_s_no_callback" in r else "-"
        lines.append(f"| {r['target']} | " + " | ".join(cells) + f" | {r['decode_tok_s']:.1f} tok/s | {bare} | "
                     f"{own} | {r['drafter_tau']:.2f} |")
    lines += ["", "Feature recording cost on llama.cpp (same pass without features):", ""]
    for r in rows:
        if "pass_ms_no_features" in r:
            lines.append(f"- {r['target']}: " + ", ".join(
                f"q={q} {r['pass_ms_no_features'][q]:.1f} ms" for q in QS))
    (HERE / "measure.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
