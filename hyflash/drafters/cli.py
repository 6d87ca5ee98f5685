"""`hyflash drafter new`, `info` and `trim`. Heavy imports happen inside the handlers."""

from __future__ import annotations

import json

from hyflash.drafters.config import KINDS, MEMORY_RULES, DrafterConfig
from hyflash.errors import HyflashError

DEFAULT_CONTEXTS = "512,2048,8192"


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("drafter", help="create and inspect HyFlash-family drafters")
    sub = p.add_subparsers(dest="drafter_command", metavar="SUBCOMMAND")
    p.set_defaults(handler=lambda args: p.print_help() or 0)
    defaults = DrafterConfig()

    new = sub.add_parser("new", help="create an untrained drafter for a target model")
    new.add_argument("--kind", required=True, choices=KINDS)
    new.add_argument("--layers", type=int, default=defaults.num_layers, help="drafter decoder layers")
    new.add_argument("--hidden-size", type=int, default=defaults.hidden_size,
                     help="the drafter's width (default: the target's hidden size)")
    new.add_argument("--window", type=int, default=defaults.window, help="local attention window (local, hyflash)")
    new.add_argument("--memory", default=defaults.memory_rule, choices=MEMORY_RULES, help="memory update rule")
    new.add_argument("--block-size", type=int, default=defaults.block_size, help="anchor + draft slots")
    new.add_argument("--chunk-size", type=int, default=defaults.chunk_size, help="memory eviction chunk")
    new.add_argument("--draft-vocab", type=int, default=None, help="reduced draft vocabulary size (default: full)")
    new.add_argument("--model", default="smollm2-135m", help="target: built-in name or a model folder")
    new.add_argument("--seed", type=int, default=0)
    new.add_argument("--out", required=True, help="folder to write (replaced if it exists)")
    new.set_defaults(handler=cmd_new)

    info = sub.add_parser(
        "info", help="configuration, parameter count, weight bytes and measured draft memory of a drafter"
    )
    info.add_argument("path", metavar="DIR", help="a drafter folder, or `default` (the one shipped for --model)")
    info.add_argument("--model", default=None,
                      help="target (default: the one the drafter was built for; smollm2-135m for `default`)")
    info.add_argument("--context", default=DEFAULT_CONTEXTS, help="comma-separated context lengths to measure")
    info.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="as for generate")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(handler=cmd_info)

    trim = sub.add_parser(
        "trim", help="a copy of a trained drafter with a smaller draft vocabulary (its most frequent ids)",
        description="Keeps the first N ids of the draft vocabulary: training orders them end-of-sequence first, "
                    "then by frequency in the training data. A smaller head is cheaper to read per draft; tokens "
                    "left out can no longer be drafted (output stays exactly the target's).")
    trim.add_argument("path", metavar="DIR", help="a drafter folder, or `default` (the one shipped for --model)")
    trim.add_argument("--draft-vocab", type=int, required=True, help="ids to keep")
    trim.add_argument("--model", default=None, help="target whose shipped drafter `default` names")
    trim.add_argument("--out", required=True, help="folder to write (replaced if it exists)")
    trim.set_defaults(handler=cmd_trim)


def cmd_new(args) -> int:
    import torch

    from hyflash.drafters.model import DrafterModel
    from hyflash.targets import HFTarget

    target = HFTarget.load(args.model, dtype="float32")
    config = DrafterConfig.for_target(
        target,
        kind=args.kind,
        num_layers=args.layers,
        hidden_size=args.hidden_size,
        window=args.window,
        memory_rule=args.memory,
        block_size=args.block_size,
        chunk_size=args.chunk_size,
        draft_vocab_size=args.draft_vocab,
    )
    torch.manual_seed(args.seed)
    model = DrafterModel(config, target)
    path = model.save_pretrained(args.out)
    print(f"created an untrained {config.kind} drafter ({model.param_count():,} parameters) for {args.model} in {path}")
    return 0


def _contexts(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        raise HyflashError(f"--context wants positive lengths separated by commas, e.g. {DEFAULT_CONTEXTS}")
    return lengths


def measure_draft_memory(model, length: int, piece: int = 1024) -> dict:
    """Run the inference state over a random context of `length` tokens, draft once, report bytes held."""
    import time

    import torch

    from hyflash.drafters.state import DrafterState
    from hyflash.sampling import SamplingConfig

    cfg, target = model.config, model.target
    state = DrafterState(model)
    g = torch.Generator().manual_seed(length)
    for lo in range(0, length, piece):
        n = min(piece, length - lo)
        features = torch.randn(n, len(cfg.feature_layers), cfg.target_hidden_size, generator=g).to(target.dtype)
        state.ingest(torch.randint(0, cfg.target_vocab_size, (n,), generator=g), features)
    times = []
    for _ in range(3):  # the fastest of three greedy drafts of a full block
        start = time.perf_counter()
        state.draft(0, cfg.block_size - 1, SamplingConfig(), None)
        times.append(time.perf_counter() - start)
    return {"bytes": state.memory_bytes(), "draft_ms": 1000 * min(times)}


def resolve_info_path(spec: str, model: str | None) -> tuple[str, str | None]:
    """`drafter info` argument -> (drafter folder, target name or None). `default` is the drafter shipped for
    `model` (the default model when none is given), as `generate --drafter default` resolves it."""
    if spec != "default":
        return spec, model
    from hyflash.drafters.registry import resolve_spec
    from hyflash.targets import DEFAULT_MODEL

    model = model or DEFAULT_MODEL
    return resolve_spec(spec, model), model


def weight_bytes(model) -> dict:
    """Bytes of the drafter's own weights as loaded: every tensor it saves (parameters and saved buffers) plus
    the copy of the target's LM-head rows it keeps for a reduced draft vocabulary. Context state is apart."""
    saved = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    head_copy = 0
    if model.draft_vocab_ids is not None:  # `logits` gathers these rows once and keeps them
        head = model._head_weight()
        head_copy = head.numel() * head.element_size()
    return {"total": saved + head_copy, "saved_tensors": saved, "head_copy": head_copy}


def cmd_info(args) -> int:
    from hyflash.drafters.loading import read_config
    from hyflash.drafters.model import DrafterModel
    from hyflash.targets import HFTarget

    lengths = _contexts(args.context)
    path, model_name = resolve_info_path(args.path, args.model)
    config = read_config(path)
    model_name = model_name or config.target_name
    if not model_name:
        raise HyflashError(f"{path} does not record its target: pass --model")
    target = HFTarget.load(model_name, dtype=args.dtype)
    model = DrafterModel.from_pretrained(path, target)
    weights = weight_bytes(model)
    memory = {n: measure_draft_memory(model, n) for n in lengths}
    if args.json:
        out = {
            "path": str(path),
            "model": model_name,
            "dtype": args.dtype,
            "config": config.to_dict(),
            "param_count": model.param_count(),
            "weight_bytes": weights["total"],
            "weight_bytes_detail": {"saved_tensors": weights["saved_tensors"], "head_copy": weights["head_copy"]},
            "draft_memory_bytes": {str(n): m["bytes"] for n, m in memory.items()},
            "draft_ms": {str(n): round(m["draft_ms"], 2) for n, m in memory.items()},
        }
        print(json.dumps(out))
        return 0
    c = config
    width = f"width {c.hidden_size}"
    if c.has_out_proj:
        width += f" (projected to the target's {c.target_hidden_size} for its LM head)"
    print(f"drafter {path}: kind {c.kind}, {c.num_layers} layer(s), {width}, block {c.block_size}, "
          f"heads {c.num_heads}x{c.head_dim}, mlp {c.intermediate_size}")
    if c.kind in ("local", "hyflash"):
        print(f"  window {c.window} (+ up to {c.chunk_size - 1} not yet evicted)")
    if c.has_memory:
        print(f"  memory rule {c.memory_rule}, eviction chunk {c.chunk_size}, combine {c.memory_combine}")
    vocab = "full" if c.draft_vocab_size is None else f"{c.draft_vocab_size:,} ids"
    print(f"  target {model_name}: hidden {c.target_hidden_size}, vocab {c.target_vocab_size:,}, "
          f"{c.target_num_layers} layers, features from layers {c.feature_layers}; draft vocabulary {vocab}")
    print(f"  parameters: {model.param_count():,} trainable (the target's embedding and LM head are borrowed)")
    head = ""
    if weights["head_copy"]:
        head = f", of which {weights['head_copy'] / 2**20:.1f} MiB is its copy of the target's LM-head rows"
    print(f"  weights ({args.dtype}): {weights['total']:,} bytes = {weights['total'] / 2**20:.1f} MiB{head}; "
          "the draft memory below (context state) comes on top")
    print(f"  draft memory ({args.dtype}, measured after ingesting random contexts):")
    print(f"  {'context':>9} {'bytes':>14} {'KiB':>10} {'draft ms':>9}")
    for n, m in memory.items():
        print(f"  {n:>9} {m['bytes']:>14,} {m['bytes'] / 1024:>10.1f} {m['draft_ms']:>9.1f}")
    return 0


def trim_draft_vocab(src, size: int, out):
    """Write a copy of the drafter at `src` that keeps the first `size` ids of its draft vocabulary."""
    import dataclasses

    from hyflash.drafters.loading import read_config, read_weights, write_checkpoint

    config = read_config(src)
    current = config.draft_vocab_size
    if current is None:
        raise HyflashError(f"{src} drafts over the full vocabulary, which has no frequency order to trim by: "
                           "train it with --draft-vocab-size instead")
    if not 1 <= size < current:
        raise HyflashError(f"--draft-vocab {size}: pass a size between 1 and {current - 1} "
                           f"(the drafter at {src} has {current:,} ids)")
    tensors = read_weights(src)
    tensors["draft_vocab_ids"] = tensors["draft_vocab_ids"][:size].clone()
    return write_checkpoint(out, dataclasses.replace(config, draft_vocab_size=size), tensors)


def cmd_trim(args) -> int:
    path, _ = resolve_info_path(args.path, args.model)
    out = trim_draft_vocab(path, args.draft_vocab, args.out)
    print(f"wrote {out}: the drafter at {path} with its {args.draft_vocab:,} most frequent draft ids")
    return 0
