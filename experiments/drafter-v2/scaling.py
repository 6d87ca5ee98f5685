"""Held-out tau against training tokens seen (log x): the drafter-v2 run (continued from the shipped drafter)
and the from-scratch base run of the recipe sweep. Writes scaling.{json,png} next to this file.

usage: .venv/bin/python experiments/drafter-v2/scaling.py [runs/drafter-v2] [runs/recipe/base]

Other runs (experiments/gpu-recipe/recipe.sh): name each with --run LABEL=PATH (a run folder holding log.jsonl, or a
log file itself; repeat for several) and say where to write with --out DIR; --title and --ylabel replace the
plot's texts. Without --run the two runs above are plotted, exactly as before.
"""

import argparse
import json
from pathlib import Path

from hyflash.files import read_jsonl

TITLE = "SmolLM2-135M drafter: held-out τ vs training tokens"
YLABEL = "held-out τ (12 chat prompts, greedy, bf16)"


def log_file(run: Path) -> Path:
    """A run folder's log.jsonl, or the path itself when it names a log file (e.g. a committed train_log.jsonl)."""
    return run if run.is_file() else run / "log.jsonl"


def curve(run: Path) -> list[dict]:
    records = read_jsonl(log_file(run))
    # tokens_seen counts from 0 again after a resume (`hyflash train --resume` keeps the log up to the restored
    # checkpoint): add the count reached before each restart, so the x axis is cumulative over the whole run.
    seen, offset, last_raw, last_total = {}, 0, -1, 0
    for r in records:
        if "tokens_seen" in r:
            if r["tokens_seen"] < last_raw:
                offset = last_total
            last_raw, last_total = r["tokens_seen"], offset + r["tokens_seen"]
            seen[r["step"]] = last_total
    points = []
    for r in records:
        if "eval" in r:
            step = r["step"]
            # tokens_seen is logged every few steps: take the nearest logged step at or after this one
            later = [s for s in seen if s >= step]
            tokens = seen[min(later)] * step / min(later) if later else None
            points.append({"step": step, "tokens_seen": tokens, "tau": r["eval"]["tau"],
                           "acceptance_by_position": r["eval"]["acceptance_by_position"]})
    return points


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", help="the drafter-v2 run and the recipe base run (default: "
                                           "runs/drafter-v2 runs/recipe/base); not with --run")
    p.add_argument("--run", action="append", default=[], metavar="LABEL=PATH",
                   help="a run to plot: its label and its folder (or log file); repeat for several")
    p.add_argument("--out", default="", help="folder for scaling.{json,png} (default: next to this file)")
    p.add_argument("--title", default=TITLE)
    p.add_argument("--ylabel", default=YLABEL)
    args = p.parse_args(argv)
    if args.run and args.runs:
        p.error("give runs either as positional paths or with --run LABEL=PATH, not both")
    if len(args.runs) > 2:
        p.error("at most two positional runs (the drafter-v2 run and the recipe base run)")
    for spec in args.run:
        if "=" not in spec or not spec.split("=", 1)[0] or not spec.split("=", 1)[1]:
            p.error(f"--run {spec!r}: expected LABEL=PATH")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if args.run:
        runs = {label: Path(path) for label, path in (spec.split("=", 1) for spec in args.run)}
    else:
        positional = args.runs + [None] * (2 - len(args.runs))
        runs = {"drafter-v2 (from the shipped drafter)": Path(positional[0] or "runs/drafter-v2"),
                "from scratch (recipe base)": Path(positional[1] or "runs/recipe/base")}
    out = {name: curve(path) for name, path in runs.items() if log_file(path).exists()}
    here = Path(args.out) if args.out else Path(__file__).parent
    here.mkdir(parents=True, exist_ok=True)
    (here / "scaling.json").write_text(json.dumps(out, indent=1) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in out.items():
        xs = [p["tokens_seen"] for p in points if p["tokens_seen"]]
        ys = [p["tau"] for p in points if p["tokens_seen"]]
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens seen in the run (sequence tokens, log scale)")
    ax.set_ylabel(args.ylabel)
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(here / "scaling.png", dpi=120)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
