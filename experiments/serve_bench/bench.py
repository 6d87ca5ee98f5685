"""Time-to-first-token and decode speed through `hyflash serve` against `hyflash generate`, same settings.

`generate` runs in this process through the CLI (`main(["generate", ..., "--json"])`, one warm-up call first):
its time to first token is the prefill time it reports (prompt in, first token out), its decode speed the
tokens per second after the prefill. Then a `hyflash serve` process with the same engine options answers the
same prompts as streamed chat completions through the `openai` client: time to first token is from sending
the request to the first chunk with text, decode speed the completion tokens over the time from that chunk to
the last. The phases do not overlap, so client and engines never share the CPU. Greedy, so the texts must
also be equal (the `same_text` column).

Writes results.json and table.md into --out.

usage: python experiments/serve_bench/bench.py [--model smollm2-135m] [--drafter default] [--dtype auto]
           [--max-tokens 128] [--repeats 2] [--out experiments/serve_bench/results]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from hyflash.cli import main as hyflash_main  # noqa: E402
from hyflash.files import atomic_write_bytes, atomic_write_json  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Explain in three sentences what a hash table is.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python class Stack with push, pop and peek methods.",
    "List five tips for writing readable code.",
]


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


def engine_args(args) -> list[str]:
    return ["--model", args.model, "--drafter", args.drafter, "--dtype", args.dtype]


def run_generate(args, prompt: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = hyflash_main(["generate", *engine_args(args), "--prompt", prompt, "--max-new-tokens",
                             str(args.max_tokens), "--json"])
    if code:
        raise SystemExit(f"hyflash generate failed with status {code}")
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    return {"ttft_s": result["prefill_time"], "decode_tok_s": result["tokens_per_second"],
            "tokens": result["new_tokens"], "tau": result["tau"], "dtype": result["dtype"],
            "policy": result["policy"], "text": result["text"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "hyflash.cli", "serve", *engine_args(args), "--port", str(port)],
                               stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.monotonic() + 600  # a first run may convert and calibrate the model
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return process
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise SystemExit(f"the server did not start; see {log}")


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
        return json.load(response)


def run_served(client, model: str, prompt: str, max_tokens: int) -> dict:
    sent = time.perf_counter()
    first = last = None
    text, usage, extension = [], None, {}
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                temperature=0, max_tokens=max_tokens, stream=True):
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or now
            last = now
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage, extension = chunk.usage, (chunk.model_extra or {}).get("hyflash", {})
    return {"ttft_s": first - sent, "decode_tok_s": usage.completion_tokens / (last - first),
            "tokens": usage.completion_tokens, "tau": extension.get("tau"),
            "server_decode_tok_s": extension.get("decode_tokens_per_second"),
            "server_ttft_s": extension.get("time_to_first_token_s"), "policy": extension.get("policy", {}),
            "text": "".join(text)}


def mean_draft_length(rows: list[dict]) -> float:
    """The mean draft length verified per pass (0 for a plain pass), over all runs: what the policy chose."""
    lengths: dict[int, int] = {}
    for row in rows:
        for k, n in row["policy"].get("draft_lengths", {}).items():
            lengths[int(k)] = lengths.get(int(k), 0) + n
    passes = sum(lengths.values())
    return sum(k * n for k, n in lengths.items()) / passes if passes else 0.0


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafter", default="default")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="passes over the prompts per side")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "serve_bench" / "results")
    args = parser.parse_args(argv)
    import openai

    print("generate: warm-up, then", len(PROMPTS) * args.repeats, "generations", file=sys.stderr, flush=True)
    run_generate(args, PROMPTS[0])
    generated = [dict(run_generate(args, p), prompt=i) for _ in range(args.repeats) for i, p in enumerate(PROMPTS)]

    port = free_port()
    args.out.mkdir(parents=True, exist_ok=True)
    server = start_server(args, port, Path(tempfile.mkdtemp(prefix="serve-bench-")) / "server.log")
    try:
        served_dtype = health(port)["dtype"]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
        print("serve: warm-up, then", len(PROMPTS) * args.repeats, "requests", file=sys.stderr, flush=True)
        run_served(client, args.model, PROMPTS[0], args.max_tokens)
        served = [dict(run_served(client, args.model, p, args.max_tokens), prompt=i)
                  for _ in range(args.repeats) for i, p in enumerate(PROMPTS)]
    finally:
        server.terminate()
        server.wait(timeout=60)

    same = [g["text"] == s["text"] for g, s in zip(generated, served)]
    summary = {
        "generate": {k: median(generated, k) for k in ("ttft_s", "decode_tok_s", "tau")},
        "serve": {k: median(served, k) for k in ("ttft_s", "decode_tok_s", "tau", "server_decode_tok_s")},
    }
    for side, rows in (("generate", generated), ("serve", served)):
        summary[side]["mean_draft_length"] = mean_draft_length(rows)
    summary["generate"]["dtype"] = sorted({g["dtype"] for g in generated})
    summary["serve"]["dtype"] = [served_dtype]
    summary["ratio_serve_over_generate"] = {k: summary["serve"][k] / summary["generate"][k]
                                            for k in ("ttft_s", "decode_tok_s")}
    results = {"cpu": cpu_name(), "model": args.model, "drafter": args.drafter, "dtype": args.dtype,
               "max_tokens": args.max_tokens, "repeats": args.repeats, "prompts": PROMPTS,
               "same_text": sum(same), "of": len(same), "summary": summary,
               "generate": generated, "serve": served}
    atomic_write_json(args.out / "results.json", results)
    g, s, r = summary["generate"], summary["serve"], summary["ratio_serve_over_generate"]
    table = "\n".join([
        f"# hyflash serve vs hyflash generate ({args.model}, drafter {args.drafter}, dtype {args.dtype}, greedy, "
        f"{args.max_tokens} tokens, {len(same)} runs each; {results['cpu']})",
        "",
        "| | dtype | median time to first token (ms) | median decode tok/s | median τ | mean draft length |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
        f"| hyflash generate | {', '.join(g['dtype'])} | {1000 * g['ttft_s']:.1f} | {g['decode_tok_s']:.1f} | "
        f"{g['tau']:.2f} | {g['mean_draft_length']:.2f} |",
        f"| hyflash serve (streamed, openai client) | {', '.join(s['dtype'])} | {1000 * s['ttft_s']:.1f} | "
        f"{s['decode_tok_s']:.1f} | {s['tau']:.2f} | {s['mean_draft_length']:.2f} |",
        f"| serve / generate | | {r['ttft_s']:.3f} | {r['decode_tok_s']:.3f} | | |",
        "",
        f"Same text as generate: {sum(same)} of {len(same)} runs.",
        "",
    ])
    atomic_write_bytes(args.out / "table.md", table.encode())
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
