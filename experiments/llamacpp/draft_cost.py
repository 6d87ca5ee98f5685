"""What one draft of the shipped drafter costs on the llama.cpp backend, next to a target step.

    ../shared/bin/heavy .venv/bin/python experiments/llamacpp/draft_cost.py [GGUF] [--compare NAME=DIR ...]

(GGUF: another file of the same model, e.g. cache/smollm2-135m-f16.gguf; results in draft_cost-<stem>.*; on a
llama.cpp built without llamafile's sgemm, as `make venv` builds it, the names end in -no-llamafile.
--compare adds other drafter folders, e.g. the 8,192-id head shipped before 2026-12-02:
`git show 7f09aec:hyflash/assets/drafters/smollm2-135m/model.safetensors` and its config.json into a folder.)

The shipped SmolLM2 Q4_1 GGUF with 300 tokens of context (hyflash's own source). Median of 60 of each:
- a one-token and an eight-token target pass (features on, as in speculative decoding);
- one 7-token chain draft warm (drafts back to back), and right after an eight-token target pass (as in the
  decoding loop), and right after streaming 256 MB through the cache with no target pass at all (if that
  costs what the loop does, the loop's extra is the pass evicting the drafter's weights, not threads);
- with torch on 1 and on 2 threads;
- with the drafting path as shipped (`FastDraft`: stacked Linears, cached RoPE, one attention product) and
  with the general `DrafterModel` path (`DrafterState(model, fast=False)`), both int8, and the shipped path
  for every --compare folder (e.g. another draft vocabulary: a larger or smaller head to read), and the
  shipped path in bf16 instead of int8 (on CPUs with native bf16 a small bf16 product may be the cheaper);
- and the drafter's other per-step work, ingesting 3 verified tokens, right after a target pass;
- and in the decoding loop itself (`hyflash.decoding.generate`, every draft verified in full), where each draft
  follows a target pass and the ingest of its verified tokens: per drafting path the median draft and ingest,
  next to the median one-token step of plain decoding on the same prompts (6 chat prompts, 64 new tokens,
  plain and speculative taking turns prompt by prompt). This is the share the issue's bar is about.
Writes draft_cost.json and draft_cost.md next to this file (or into --out DIR).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from batch_invariance import result_stem
from hyflash.bench.datasets import load_set
from hyflash.decoding import generate
from hyflash.drafters.loading import inference_dtype, read_config
from hyflash.drafters.model import DrafterModel
from hyflash.drafters.registry import load_drafter, shipped_drafter_path
from hyflash.drafters.state import DrafterState
from hyflash.machine import cpu_description, physical_cores
from hyflash.sampling import SamplingConfig
from hyflash.targets.llamacpp import LlamaCppTarget, gguf_path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GREEDY = SamplingConfig()


def median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 3)


def timed(fn, n: int = 60) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return median_ms(samples)


def draft_after(setup, drafters: dict, last: int, n: int = 200) -> dict:
    """Median ms of one draft right after `setup`, per drafter, the drafters taking turns (so a machine that
    drifts during the run shifts them alike)."""
    samples = {name: [] for name in drafters}
    for _ in range(n):
        for name, drafter in drafters.items():
            setup()
            start = time.perf_counter()
            drafter.draft(last, 7, GREEDY, None)
            samples[name].append(time.perf_counter() - start)
    return {name: median_ms(s) for name, s in samples.items()}


def ingest_after(setup, drafter, ids, features, n: int = 60) -> float:
    """Ingest 3 verified tokens after `setup`, then put the drafter back where it was (not timed)."""
    samples = []
    for _ in range(n):
        setup()
        start = time.perf_counter()
        drafter.ingest(torch.tensor(ids[-3:]), features[-3:])
        samples.append(time.perf_counter() - start)
        drafter.reset()
        drafter.ingest(torch.tensor(ids[:-3]), features[:-3])
    return median_ms(samples)


class TimedDrafter:
    """A drafter that records how long each draft (`propose`) and each ingest takes inside the decoding loop."""

    def __init__(self, drafter):
        self.drafter, self.drafts, self.ingests, self.prefill = drafter, [], [], True

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def reset(self) -> None:
        self.drafter.reset()
        self.prefill = True

    def ingest(self, tokens, features) -> None:
        start = time.perf_counter()
        self.drafter.ingest(tokens, features)
        if not self.prefill:  # the prompt's ingest is part of the prefill, not of a step
            self.ingests.append(time.perf_counter() - start)
        self.prefill = False

    def propose(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.drafter.propose(*args, **kwargs)
        self.drafts.append(time.perf_counter() - start)
        return out


def in_the_loop(target, paths: dict, prompts, max_new_tokens: int = 64) -> list[dict]:
    """Per drafting path: median draft and ingest in real speculative decoding, against the median one-token
    step (target pass and greedy choice) of plain decoding, prompt by prompt in turns."""
    timed_paths = {name: TimedDrafter(drafter) for name, drafter in paths.items()}
    steps = []
    for prompt in prompts:
        plain = generate(target, prompt.ids, None, max_new_tokens=max_new_tokens)
        steps.append(plain.verify_time / plain.target_passes)
        for timed_drafter in timed_paths.values():
            generate(target, prompt.ids, timed_drafter, max_new_tokens=max_new_tokens)
    step = median_ms(steps)
    rows = []
    for name, timed_drafter in timed_paths.items():
        draft, ingest = median_ms(timed_drafter.drafts), median_ms(timed_drafter.ingests)
        rows.append({"drafting_path": name, "torch_threads": torch.get_num_threads(), "drafts": len(timed_drafter.drafts),
                     "plain_step_ms": step, "draft_ms": draft, "ingest_ms": ingest,
                     "draft_share_of_a_step": round(draft / step, 3),
                     "draft_and_ingest_share": round((draft + ingest) / step, 3)})
        print(rows[-1], flush=True)
    return rows


def table(rows: list[dict]) -> list[str]:
    keys = list(rows[0])
    lines = ["| " + " | ".join(k.replace("_", " ") for k in keys) + " |", "|" + "---:|" * len(keys)]
    return lines + ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]


def write_report(rows: list[dict], loop_rows: list[dict], cpu: str, file_name: str, out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps({"cpu": cpu, "file": file_name, "rows": rows,
                                                   "in_the_loop": loop_rows}, indent=1))
    lines = [f"# One draft on the llama.cpp backend ({cpu}, llama.cpp on 2 threads, {file_name}, 300 tokens of context)",
             "", "`experiments/llamacpp/draft_cost.py`; medians of 60 (draft after a target pass: 200, the two paths taking turns), milliseconds.", "",
             *table(rows), "", "## In the decoding loop", "",
             "Every draft verified in full on 6 chat prompts, 64 new tokens; each draft follows a target pass and the",
             "ingest of the tokens it verified. Plain step: the median one-token step of plain decoding on the same",
             "prompts, run in turns with the speculative runs. Medians, milliseconds.", "", *table(loop_rows)]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(path: Path | None = None, compare: dict[str, Path] | None = None, out_dir: Path = HERE) -> None:
    stem = result_stem("draft_cost", path)
    gguf = path or gguf_path("smollm2-135m")
    target = LlamaCppTarget(gguf, n_threads=2)
    folder = shipped_drafter_path("smollm2-135m")
    general = DrafterState(DrafterModel.from_pretrained(folder, target, dtype=inference_dtype(target)), fast=False)
    vocab = read_config(folder).draft_vocab_size
    paths = {f"fast (shipped, {vocab} ids)": load_drafter(folder, target), "general": general.quantize_int8()}
    # bf16 weights instead of int8: on CPUs with AMX / AVX-512 BF16 a small bf16 product may beat fbgemm's int8.
    paths["fast, bfloat16 weights"] = DrafterState(DrafterModel.from_pretrained(folder, target, dtype=torch.bfloat16))
    for name, other in (compare or {}).items():
        paths[f"fast, {name} ({read_config(other).draft_vocab_size} ids)"] = load_drafter(other, target)
    ids = target.tokenizer.encode((ROOT / "hyflash" / "decoding.py").read_text()[:3000])[:300]
    out = target.prefill(torch.tensor(ids), features=True)
    for drafter in paths.values():
        drafter.reset()
        drafter.ingest(torch.tensor(ids[:-3]), out.features[:-3])
        drafter.ingest(torch.tensor(ids[-3:]), out.features[-3:])
    block = torch.tensor(ids[-8:])
    junk = np.ones(256 << 20, dtype=np.uint8)

    def pass_of(q: int):
        def run():
            target.score(block[:q], features=True)
            target.rollback(target.cache_length - q)
        return run

    def stream():
        junk.sum()  # reads 256 MB

    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        step_1, step_8 = timed(pass_of(1)), timed(pass_of(8))
        after_pass = draft_after(pass_of(8), paths, ids[-1])
        after_stream = draft_after(stream, paths, ids[-1], n=60)
        for path, drafter in paths.items():
            row = {"drafting_path": path, "torch_threads": threads, "target_pass_1_ms": step_1,
                   "target_pass_8_ms": step_8,
                   "draft_warm_ms": timed(lambda: drafter.draft(ids[-1], 7, GREEDY, None)),
                   "draft_after_target_pass_ms": after_pass[path],
                   "draft_after_256MB_stream_ms": after_stream[path],
                   "ingest_3_after_target_pass_ms": ingest_after(pass_of(8), drafter, ids, out.features)}
            row["draft_after_pass_share_of_a_one_token_pass"] = round(row["draft_after_target_pass_ms"] / row["target_pass_1_ms"], 3)
            row["draft_and_ingest_share"] = round(
                (row["draft_after_target_pass_ms"] + row["ingest_3_after_target_pass_ms"]) / row["target_pass_1_ms"], 3)
            rows.append(row)
            print(row, flush=True)
    torch.set_num_threads(physical_cores())  # the commands' default (`hyflash.cli.set_threads`)
    loop_rows = in_the_loop(target, paths, load_set("chat", target, 6, 64))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_report(rows, loop_rows, cpu_description()[0], gguf.name, out_dir / stem)


def parse_args(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", type=Path, help="another GGUF file of SmolLM2-135M (default: the shipped Q4_1)")
    parser.add_argument("--compare", nargs="*", default=[], metavar="NAME=DIR", help="other drafter folders to time")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the results (default: beside this script)")
    args = parser.parse_args(argv)
    compare = {}
    for item in args.compare:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            parser.error(f"--compare takes NAME=DIR, got {item!r}")
        compare[name] = Path(folder)
    return args.gguf, compare, args.out


if __name__ == "__main__":
    main(*parse_args())
