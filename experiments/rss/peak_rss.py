"""Peak resident memory of `hyflash generate` on a long prompt, plain against the default drafter (issue 39, 7).

Each setting runs in a fresh Python process (so one peak cannot hide another): the child calls the CLI's `main`
with `--json` and then reports its own peak RSS (VmHWM in /proc/self/status). The prompt is the first 26,000
characters of the first held-out stdlib module longer than 30,000 (about 7.5k SmolLM2 tokens), with no chat
template and 4 new tokens, so the prefill and the drafter's ingest of the whole prompt dominate.

    ../shared/bin/heavy .venv/bin/python -m experiments.rss.peak_rss      # from the repository root

Writes experiments/rss/peak_rss.{json,md}. The bar (issue 39): <= 1.5 GiB with the default drafter in fp32.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from hyflash.files import atomic_write_bytes, atomic_write_json

HERE = Path(__file__).resolve().parent
CHILD = """
import json, sys
from hyflash.cli import main
code = main(sys.argv[1:])
status = open("/proc/self/status").read()
peak_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
print(json.dumps({"peak_rss_bytes": peak_kb * 1024, "exit": code}), file=sys.stderr)
"""


def long_prompt(chars: int) -> str:
    from hyflash.bench.datasets import _read_module, heldout_stdlib_modules

    texts = (_read_module(m) for m in heldout_stdlib_modules())
    return next(t for t in texts if t and len(t) > 30000)[:chars]


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def measure(prompt: str, drafter: str, dtype: str, new_tokens: int) -> dict:
    argv = ["generate", "--no-chat", "--no-adaptive", "--json", "--max-new-tokens", str(new_tokens),
            "--drafter", drafter, "--dtype", dtype, "--prompt", prompt]
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
    try:
        report = json.loads(proc.stderr.strip().splitlines()[-1])
        out = json.loads(proc.stdout) if report["exit"] == 0 else None
    except (json.JSONDecodeError, IndexError):
        out = None
    if out is None:
        raise SystemExit(f"hyflash generate failed for --drafter {drafter} --dtype {dtype}:\n{proc.stderr[-3000:]}")
    return {"drafter": drafter, "dtype": dtype, "prompt_tokens": out["prompt_tokens"], "tokens": out["tokens"],
            "peak_rss_bytes": report["peak_rss_bytes"]}


def markdown(result: dict) -> str:
    lines = [f"Command: `{result['command']}` on {result['cpu']}", "",
             "| drafter | dtype | prompt tokens | peak RSS |", "|---|---|---:|---:|"]
    lines += [f"| {r['drafter']} | {r['dtype']} | {r['prompt_tokens']} | {r['peak_rss_bytes'] / 2**30:.2f} GiB |"
              for r in result["runs"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--drafters", default="none,default")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--chars", type=int, default=26000)
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--out", default=str(HERE / "peak_rss"), help="writes OUT.json and OUT.md")
    args = p.parse_args()
    prompt = long_prompt(args.chars)
    runs = [measure(prompt, d, t, args.new_tokens) for t in args.dtypes.split(",") for d in args.drafters.split(",")]
    for dtype in {r["dtype"] for r in runs}:  # the drafter must not change greedy text
        texts = {r["drafter"]: r["tokens"] for r in runs if r["dtype"] == dtype}
        if len({tuple(t) for t in texts.values()}) > 1:
            raise SystemExit(f"{dtype}: the drafters' tokens differ: {texts}")
    result = {"cpu": cpu_name(), "command": "python -m experiments.rss.peak_rss " + " ".join(sys.argv[1:]),
              "runs": runs}
    atomic_write_json(Path(args.out + ".json"), result)
    atomic_write_bytes(Path(args.out + ".md"), markdown(result).encode())
    print(markdown(result))


if __name__ == "__main__":
    main()
