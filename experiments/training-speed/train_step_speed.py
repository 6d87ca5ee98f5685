"""Seconds per training step of one drafter recipe under each bf16 autocast setting, on this machine.

Times the target's feature pass over the first batch in bfloat16 and in float32 (--feature-compute-dtype), fills
the feature cache for the first --steps batches (so no step pays the target's pass), then trains
--steps steps from scratch per setting (the same batches, the same seed) and reports the median of each run's
per-step times (log.jsonl's seconds_per_step, one per step). Writes results.json and table.md into --out.
Defaults: the kinds grid's CPU recipe (experiments/kinds/grid.sh) for hyflash at depth 2.

usage: python experiments/training-speed/train_step_speed.py --out DIR [--kind hyflash] [--num-layers 2] [--steps 4] \
           [--settings on,off,auto] [--data DIR ...] [--feature-cache cache/features] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

GRID_DATA = ["data/smollm2-135m/train-v2", "data/smollm2-135m/long-v1", "data/smollm2-135m/train-v3"]
SETTINGS = {"on": True, "off": False, "auto": None}


def main(argv: list[str] | None = None) -> int:
    import torch

    from hyflash.bench.run import machine_info
    from hyflash.machine import bf16_matmul_pays
    from hyflash.errors import HyflashError
    from hyflash.files import atomic_write_json
    from hyflash.targets import HFTarget
    from hyflash.training.batches import training_batches
    from hyflash.training.config import TrainConfig
    from hyflash.training.data import TokenDataset
    from hyflash.training.features import FeatureCache, batch_features
    from hyflash.training.train import feature_source, train

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for results.json and table.md")
    p.add_argument("--kind", default="hyflash")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--settings", default="on,off,auto", help="autocast settings to time: on, off, auto")
    p.add_argument("--data", nargs="+", default=GRID_DATA)
    p.add_argument("--feature-cache", default="cache/features")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    settings = args.settings.split(",")
    try:
        if not settings or any(s not in SETTINGS for s in settings):
            raise HyflashError(f"--settings takes on, off and auto, comma-separated; got {args.settings!r}")
        if args.steps < 2:
            raise HyflashError("--steps must be >= 2 (the median of a run's steps is reported)")
        torch.set_num_threads(args.threads)
        base = TrainConfig(model="smollm2-135m", data=args.data, max_length=4096, steps=args.steps, batch_size=8,
                           anchors=64, lr=2e-3, warmup_steps=1, block_size=8, window=64, chunk_size=16,
                           draft_vocab_size=8192, gamma=4, eval_prompts=0, log_every=1, threads=args.threads,
                           feature_cache=args.feature_cache, feature_compute_dtype="float32", copy_ngram=16,
                           copy_gate=True, kind=args.kind, num_layers=args.num_layers, plot=False)
        dataset, target = TokenDataset([Path(d) for d in args.data]), HFTarget.load(base.model, dtype=base.dtype)
        source = feature_source(base, target, dataset)
        cache = FeatureCache(Path(args.feature_cache), source, target.dtype)
        feature_pass = {}
        for step, _, batch in training_batches(dataset, base.steps, base.batch_size, base.anchors, base.block_size,
                                               base.max_length, base.seed):
            if step == 0:  # the same whole sequences through each dtype's target, uncached
                for name, model in (("bfloat16", target), ("float32", source)):
                    start = time.perf_counter()
                    batch_features(model, batch, dataset, None)
                    feature_pass[name] = round(time.perf_counter() - start, 2)
                tokens = sum(len(dataset.sequences[i]) for i in batch.indices)
                print({"feature_pass_seconds": feature_pass, "tokens": tokens}, flush=True)
            batch_features(target, batch, dataset, cache, source=source)  # cached now: no step below computes
        del source
        rows = []
        for name in settings:
            with tempfile.TemporaryDirectory() as tmp:
                config = replace(base, autocast=SETTINGS[name], out=tmp)
                train(config, progress=False, target=target)
                log = [json.loads(x) for x in (Path(tmp) / "log.jsonl").read_text().splitlines()]
                used = json.loads((Path(tmp) / "train_config.json").read_text())["autocast"]
            times = [r["seconds_per_step"] for r in log if "seconds_per_step" in r]
            rows.append({"setting": name, "autocast": used, "seconds_per_step": round(statistics.median(times), 2),
                         "steps": [round(t, 2) for t in times]})
            print(rows[-1], flush=True)
    except HyflashError as exc:
        print(f"train_step_speed: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    meta = {"cpu": machine["cpu_model"], "machine": machine, "threads": args.threads, "torch": torch.__version__,
            "kind": args.kind, "num_layers": args.num_layers, "steps": args.steps, "feature_pass_seconds": feature_pass,
            "bf16_autocast_pays": bf16_matmul_pays(torch.device("cpu")),
            "command": " ".join(["python", "experiments/training-speed/train_step_speed.py", *(argv or sys.argv[1:])])}
    atomic_write_json(out / "results.json", {"meta": meta, "rows": rows})
    fastest = min(r["seconds_per_step"] for r in rows)
    lines = [f"Training step time, {args.kind} depth {args.num_layers}, the kinds grid's CPU recipe (8 x 64 anchors, "
             f"4k tokens, cached features), {meta['cpu']}, {args.threads} threads; `{meta['command']}`", "",
             "| autocast setting | bf16 autocast used | seconds per step (median) | x fastest |", "|---|---|---:|---:|"]
    lines += [f"| {r['setting']} | {r['autocast']} | {r['seconds_per_step']:.2f} | "
              f"{r['seconds_per_step'] / fastest:.1f} |" for r in rows]
    lines += ["", "The target's feature pass over the first batch (8 whole sequences, uncached): "
              + ", ".join(f"{k} {v:.1f} s" for k, v in feature_pass.items())]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
