"""Where the server's time to first token and decode speed go: the same `decoding.generate` call, greedy, on the
same prompts, run several ways, each with a fresh policy (as `hyflash generate` has):

  main            the main thread, no callback (what `hyflash generate --json` does)
  main+text       the main thread, the server's TextStream decoding the text at every pass
  thread          a new thread per generation, no callback (torch thread counts printed from inside it)
  thread+set      the same, setting torch's thread count inside the thread first
  thread-worker   one long-lived thread for all generations (as the server's engine thread)
  thread+loop     a worker thread whose callback wakes a running asyncio loop once per pass
                  (call_soon_threadsafe, as the server's worker did), a coroutine awaiting each event
  thread+loop+tick  the same with a coroutine waking every 0.1 s (as uvicorn's main loop does)
  shared-policy   the main thread, one policy kept across the generations (as the server keeps it)

usage: python experiments/serve_bench/where_time_goes.py [--model smollm2-135m] [--dtype auto] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import queue
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from hyflash import engine  # noqa: E402
from hyflash.decoding import generate  # noqa: E402
from hyflash.machine import set_torch_threads  # noqa: E402
from hyflash.policy import PolicyConfig, SpeculationPolicy  # noqa: E402
from hyflash.sampling import SamplingConfig  # noqa: E402
from hyflash.serve.worker import TextStream  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import PROMPTS  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafter", default="default")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    set_torch_threads()  # as the CLI does
    target, drafter, shared_policy, choice = engine.load(args.model, args.dtype, args.drafter)
    print(f"dtype {choice.dtype} ({choice.reason}); main thread: torch threads {torch.get_num_threads()}, "
          f"interop {torch.get_num_interop_threads()}", flush=True)
    prompts = [target.encode_prompt(p) for p in PROMPTS]
    greedy = SamplingConfig(temperature=0.0)

    def fresh_policy() -> SpeculationPolicy:
        return SpeculationPolicy(choice.curve, PolicyConfig.for_run())

    def one(ids, on_tokens=None, policy=None):
        r = generate(target, ids, drafter, max_new_tokens=args.max_tokens, sampling=greedy, seed=0,
                     on_tokens=on_tokens, policy=policy or fresh_policy())
        return r

    def in_thread(fn):
        box = {}

        def body():
            box["threads"] = (torch.get_num_threads(), torch.get_num_interop_threads())
            box["out"] = fn()

        t = threading.Thread(target=body)
        t.start()
        t.join()
        return box["out"], box["threads"]

    jobs: queue.Queue = queue.Queue()

    def serve_forever():  # one long-lived engine thread, as the server has
        while (job := jobs.get()) is not None:
            fn, box, done = job
            box["threads"] = (torch.get_num_threads(), torch.get_num_interop_threads())
            box["out"] = fn()
            done.set()

    worker = threading.Thread(target=serve_forever, daemon=True)
    worker.start()

    def on_worker(fn):
        box, done = {}, threading.Event()
        jobs.put((fn, box, done))
        done.wait()
        return box["out"], box["threads"]

    def with_loop(ids, tick: bool):
        """The engine in a thread, waking the loop in this thread once per pass."""

        async def run():
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()
            stop = asyncio.Event()

            async def ticker():
                while not stop.is_set():
                    await asyncio.sleep(0.1)

            async def consume():
                while (item := await events.get()) is not None:
                    pass

            def on_tokens(new):
                loop.call_soon_threadsafe(events.put_nowait, list(new))

            def work():
                try:
                    return one(ids, on_tokens)
                finally:
                    loop.call_soon_threadsafe(events.put_nowait, None)

            tasks = [asyncio.create_task(consume())] + ([asyncio.create_task(ticker())] if tick else [])
            result = await asyncio.to_thread(work)
            stop.set()
            await asyncio.gather(*tasks)
            return result

        return asyncio.run(run())

    def text_cb():
        stream = TextStream(target.decode)
        return lambda new: stream.feed(new)

    ways = {
        "main": lambda ids: one(ids),
        "main+text": lambda ids: one(ids, text_cb()),
        "thread": lambda ids: in_thread(lambda: one(ids)),
        "thread+set": lambda ids: in_thread(lambda: (set_torch_threads(), one(ids))[1]),
        "thread-worker": lambda ids: on_worker(lambda: one(ids)),
        "thread+loop": lambda ids: with_loop(ids, tick=False),
        "thread+loop+tick": lambda ids: with_loop(ids, tick=True),
        "shared-policy": lambda ids: one(ids, policy=shared_policy),
    }
    one(prompts[0])  # warm-up
    chosen = [name for name in ways if not args.only or name in args.only]
    results = {name: [] for name in chosen}
    threads = None
    for _ in range(args.repeats):  # round robin, so that other load on the machine hits every way alike
        for ids in prompts:
            for name in chosen:
                out = ways[name](ids)
                if isinstance(out, tuple):
                    out, threads = out
                results[name].append(out)
    for name, runs in results.items():
        ttft = statistics.median(r.prefill_time for r in runs) * 1000
        rate = statistics.median(r.tokens_per_second for r in runs)
        tau = statistics.median(r.tau for r in runs)
        extra = f"  torch threads in thread {threads}" if name.startswith("thread") else ""
        sat_out = sum(r.policy.get("expensive_drafter_retired_at_step") == 0 for r in runs)
        extra += f"  runs without the drafter {sat_out}" if sat_out else ""
        print(f"{name:18s} ttft {ttft:6.1f} ms  decode {rate:5.1f} tok/s  tau {tau:.2f}  "
              f"passes {sum(r.target_passes for r in runs)}{extra}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
