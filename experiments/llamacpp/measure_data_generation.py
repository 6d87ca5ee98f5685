"""Tokens/s of `hyflash data` generation: llama.cpp batched (BatchedGenerator) at several batch sizes, with
and without recorded features, against the transformers path (data.generate_batch). Run under
/work/shared/bin/heavy; writes a markdown table.

  python experiments/llamacpp/measure_data_generation.py --model smollm2-135m --out experiments/llamacpp/data_generation.md
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import time
from pathlib import Path

import torch

from hyflash.files import atomic_write_bytes
from hyflash.sampling import SamplingConfig
from hyflash.targets.llamacpp import LlamaCppTarget
from hyflash.training.data import DataConfig, encode, generate_batch
from hyflash.training.llamacpp_data import BatchedGenerator, Request
from hyflash.training.varied_prompts import varied_prompts


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                platform.processor())


def llamacpp_rate(target, ids, slots, new, features) -> float:
    gen = BatchedGenerator(target, slots, max(map(len, ids)) + new, features, torch.bfloat16, SamplingConfig())
    try:
        gen.generate([Request(p, new) for p in ids[:slots]])  # warm-up
        gen.stats.decode_tokens = 0
        gen.stats.decode_seconds = 0.0
        gen.generate([Request(p, new) for p in ids])
        return gen.stats.decode_rate()
    finally:
        gen.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--hf-model", default="", help="the transformers model to compare with ('' = none)")
    p.add_argument("--batches", default="1,8,16,32")
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = LlamaCppTarget.load(args.model, n_threads=args.threads)
    config = DataConfig(max_new_tokens=args.new, max_prompt_tokens=256)
    prompts = varied_prompts("train", seed=0, per_file=1, packages=False)[:64]
    ids = [encode(target, q, config) for q in prompts]
    rows = []
    for slots in map(int, args.batches.split(",")):
        n = max(slots * 2, 4)
        for features in (False, True):
            rate = llamacpp_rate(target, ids[:n], slots, args.new, features)
            rows.append(f"| llama.cpp {target.precision} | {slots} | {'yes' if features else 'no'} | {rate:.0f} |")
            print(rows[-1], flush=True)
    if args.hf_model:
        from hyflash.targets import Target

        for dtype in ("bfloat16", "float32"):
            hf = Target.load(args.hf_model, dtype=dtype)
            for slots in (8, 32):
                batch = [encode(hf, q, config) for q in prompts[:slots]]
                begin = time.perf_counter()
                outs, _ = generate_batch(hf, batch, args.new, False, config, 0, with_features=True)
                rate = sum(map(len, outs)) / (time.perf_counter() - begin)  # prefill included (small)
                rows.append(f"| transformers {dtype} | {slots} | yes | {rate:.0f} |")
                print(rows[-1], flush=True)
    text = (f"# `hyflash data` generation speed: {args.model}\n\n"
            f"{cpu_name()}, {args.threads} threads, greedy, {args.new} new tokens per prompt, varied-source prompts "
            f"(at most 256 tokens). llama.cpp: decoding tokens/s of `BatchedGenerator` (continuous batching, "
            f"one KV stream per sequence; prefill excluded); transformers: `data.generate_batch` (`model.generate`, "
            f"left padding; prefill included). `experiments/llamacpp/measure_data_generation.py`.\n\n"
            "| path | sequences per batch | features recorded | generated tok/s |\n|---|---:|---|---:|\n"
            + "\n".join(rows) + "\n")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(Path(args.out), text.encode())


if __name__ == "__main__":
    main()
