"""Time to first token across a chat about a document on llama.cpp: a cold prompt, the same prompt again, and
the conversation's next turns, with the prompt's cached chunks reused (docs/engine.md) against a target that
starts every prefill afresh (issue 36's prefill reuse; what `hyflash serve` sees from a chat client).

    python -m experiments.serve_bench.prefill_reuse [--drafter default] [--turns 3] [--out DIR]

Each turn's prompt is the whole conversation so far through the chat template (the document in the first user
message, then the model's answers and new questions), as a chat client sends it. Per turn, on one target, greedy,
48 new tokens: "reused" runs it right after the previous turn's generation (as a server would), "fresh" after
emptying the cache and its record (every prompt token runs), "again" right after that (the same prompt twice). Writes DIR/prefill_reuse.json and prefill_reuse.md (default:
experiments/serve_bench/results/).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hyflash import engine
from hyflash.bench.datasets import load_set
from hyflash.decoding import generate
from hyflash.files import atomic_write_json, atomic_write_text
from hyflash.machine import cpu_description, set_torch_threads

QUESTIONS = ("Summarise the text above in two sentences.", "Which names does it mention?",
             "What would you change in it?", "Give it a title.")


def conversation_prompts(target, document: str, answers: list[str], turns: int) -> list[list[int]]:
    """The prompt of each turn: the document and the questions so far, with the answers given so far."""
    messages, prompts = [], []
    for turn in range(turns):
        question = QUESTIONS[turn % len(QUESTIONS)]
        messages.append({"role": "user", "content": (document + "\n\n" + question) if turn == 0 else question})
        prompts.append(target.encode_chat(messages))
        if turn < len(answers):
            messages.append({"role": "assistant", "content": answers[turn]})
    return prompts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default="default")
    parser.add_argument("--document", default="prose:typer:1536", help="a never-slower item whose text to chat about")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=Path("experiments/serve_bench/results"))
    args = parser.parse_args(argv)
    set_torch_threads()
    target, drafter, policy, _ = engine.load("smollm2-135m", "auto", args.drafter, backend="llama.cpp")
    item = next(p for p in load_set("never-slower", target, 3, args.max_new_tokens) if p.item_id == args.document)
    document = target.tokenizer.decode(item.ids, skip_special_tokens=True)

    rows, answers = [], []
    for turn in range(args.turns):
        prompt = conversation_prompts(target, document, answers, turn + 1)[-1]
        for side in ("reused", "fresh", "again"):  # reused: right after the previous turn, as a server runs it
            if side == "fresh":
                target.reset()  # forget the cells and their record: this prefill runs every token
                target._prefilled.clear()
            result = generate(target, prompt, drafter, max_new_tokens=args.max_new_tokens, policy=policy)
            rows.append({"turn": turn + 1, "side": side, "prompt_tokens": len(prompt),
                         "reused_tokens": target.reused_tokens, "ttft_s": round(result.prefill_time, 4),
                         "tokens": result.tokens})
            print(f"turn {turn + 1} {side:6s}: {len(prompt)} prompt tokens, {target.reused_tokens} reused, "
                  f"time to first token {result.prefill_time:.3f} s", flush=True)
        same = {tuple(r["tokens"]) for r in rows[-3:]}
        if len(same) != 1:
            raise SystemExit(f"turn {turn + 1}: the text differs between fresh and reused prefills")
        answers.append(target.tokenizer.decode(rows[-1]["tokens"], skip_special_tokens=True))

    cpu = cpu_description()[0]
    summary = {"cpu": cpu, "drafter": args.drafter, "document": args.document, "turns": args.turns,
               "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows]}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "prefill_reuse.json", summary)
    lines = [f"# Time to first token across a chat about a document, llama.cpp ({cpu}, drafter {args.drafter})", "",
             "`python -m experiments.serve_bench.prefill_reuse`: reused = the turn's prompt right after the previous "
             "turn's generation, as a server runs it (the cached chunks of the previous prompt kept); fresh = the "
             "same prompt from its first token; again = the same prompt once more. Greedy text identical on every "
             "side.", "",
             "| turn | prompt tokens | fresh | reused (tokens kept) | again (tokens kept) |", "|---:|---:|---:|---:|---:|"]
    for turn in range(1, args.turns + 1):
        fresh, reused, again = (next(r for r in rows if r["turn"] == turn and r["side"] == s)
                                for s in ("fresh", "reused", "again"))
        lines.append(f"| {turn} | {fresh['prompt_tokens']} | {fresh['ttft_s']:.3f} s | {reused['ttft_s']:.3f} s "
                     f"({reused['reused_tokens']}) | {again['ttft_s']:.3f} s ({again['reused_tokens']}) |")
    atomic_write_text(args.out / "prefill_reuse.md", "\n".join(lines) + "\n")
    print(json.dumps(summary["rows"]))


if __name__ == "__main__":
    main()
