"""The share of training anchors whose context exceeds the drafter's window, for one run's budget.

It draws exactly the anchors `hyflash train` draws for these settings (hyflash.training.batches.training_batches:
the same epochs, batch order, crops and anchors) and writes their context statistics as JSON
(hyflash.training.batches.anchor_context_stats). No model is loaded: only the token ids are read.

usage: python experiments/kinds/anchor_context_share.py --data DIR [DIR ...] --steps S --batch-size B --anchors A \
           [--max-length 4096] [--block-size 8] [--window 64] [--chunk-size 16] [--seed 0] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing


def main(argv: list[str] | None = None) -> int:
    from hyflash.errors import HyflashError
    from hyflash.training.batches import anchor_context_stats
    from hyflash.files import atomic_write_json
    from hyflash.training.data import TokenDataset

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", required=True, help="data folders, as given to `hyflash train`")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--anchors", type=int, required=True)
    p.add_argument("--max-length", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--chunk-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON file to write")
    args = p.parse_args(argv)
    try:
        for name in ("steps", "batch_size", "anchors", "window", "chunk_size"):
            if getattr(args, name) < 1:
                raise HyflashError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        if args.block_size < 2 or args.max_length <= args.block_size:
            raise HyflashError("--block-size must be >= 2 and --max-length must exceed it")
        dataset = TokenDataset([Path(d) for d in args.data])
        stats = anchor_context_stats(dataset, args.steps, args.batch_size, args.anchors, args.block_size,
                                     args.max_length, args.seed, args.window, args.chunk_size)
    except HyflashError as exc:
        print(f"anchor_context_share: error: {exc}", file=sys.stderr)
        return 2
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    out = {"settings": settings, "data": dataset.stats(), **stats}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(args.out), out)
    print(f"{stats['share_context_exceeds_window']:.1%} of {stats['anchors']:,} training anchors have more context "
          f"than the {args.window}-token window ({stats['share_memory_in_use']:.1%} with tokens in the memory); "
          f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
