"""Registry of evaluation sets. Every set is deterministic and held out from drafter training.

  humaneval   HumanEval prompts in chat format ("Complete the following Python function"), short context
  chat        chat prompts that complete or write a Python function, from held-out standard-library modules
              (the training prompts' own kinds and templates, never their modules)
  code        raw continuation of 1k-token prefixes of held-out standard-library modules
  long-2k/4k/8k  raw continuation of 2k/4k/8k-token prefixes of the *same* big held-out modules, so the
              three sets differ only in how much context the drafter sees (the HyFlash claim is about that)
  prose       raw continuation of 384-token prefixes of package descriptions (README text in dist-info)
  ctx-1k/2k/4k/6k/8k  the 1k..8k tokens before a cut point inside a big held-out module, several cut points per
              module (the held-out split has few modules of 8k+ tokens, too few for 12 prompts from file starts):
              every ctx set has the same cut points and continuations, so the sets differ only in context
              (issue 41: per-prompt pairs across sets and kinds)
  chat-wild   24 chat requests for code written by hand unlike any training template (terse, chatty, formal,
              non-native, Spanish, pasted code to fix, review or extend, multi-turn; issue 37's held-out
              check of a drafter's generalisation), in the file's order
  never-slower  the "never slower than plain" suite (issue 36): prose (package READMEs) and code (sources of
              the held-out split's third-party packages, whose code and docstrings training never read) at
              ~128, 1.5k and 6k tokens of context, and two short chat requests (a function, a small class)

Held-out = the training code's own split (`hyflash.corpora.split_of`, a stable hash of the module
path), so the benchmark can never score memorised training code. HumanEval and package descriptions are
never read by the training code at all.

Selection is a stable order (sha256 of the source name), never Python's salted hash() or the file system's
listing order, so `--n 3` always means the same three prompts, and `--n 5` extends them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hyflash.corpora import (
    build_prompts,
    heldout_package_sources,
    humaneval_problems,
    package_descriptions,
    split_of,
    stdlib_modules,
    stdlib_root,
)
from hyflash.errors import HyflashError

HUMANEVAL_TEMPLATE = "Complete the following Python function:\n```python\n{prompt}```"
CODE_PREFIX_TOKENS = 1024
LONG_PREFIX_TOKENS = {"long-2k": 2048, "long-4k": 4096, "long-8k": 8192}
PROSE_PREFIX_TOKENS = 384
CUT_CONTEXT_TOKENS = {"ctx-1k": 1024, "ctx-2k": 2048, "ctx-4k": 4096, "ctx-6k": 6144, "ctx-8k": 8192}
CUT_STRIDE_TOKENS = 2048  # between the cut points of one module: their continuations never overlap
# Code-page tables (encodings/cp437.py ...) are generated lookup tables: trivially predictable, not real code.
_SKIP_PREFIXES = ("encodings/",)
_CHARS_PER_TOKEN_MAX = 16  # characters read per wanted token: enough for any tokenizer (even a word-level one)


@dataclass(frozen=True)
class BenchPrompt:
    set_name: str
    item_id: str  # unique within the set, e.g. "HumanEval/12" or "typing.py:2048"
    source: str  # where the text came from: task id, stdlib module path, or package name
    ids: tuple[int, ...]  # token ids given to the target
    chat: bool  # True when the chat template was applied


@dataclass(frozen=True)
class EvalSet:
    name: str
    description: str
    context_tokens: int  # nominal prompt length; the real lengths are recorded per prompt
    build: Callable[["object", int, int], list[BenchPrompt]]  # (target, n, max_new_tokens) -> prompts


def stable_order(names) -> list[str]:
    """A shuffled but fixed order: sorted by sha256 of the name."""
    return sorted(names, key=lambda s: hashlib.sha256(s.encode()).hexdigest())


def _raw_prefix(target, text: str, prefix_tokens: int) -> list[int] | None:
    """The first `prefix_tokens` tokens of text (no chat template), or None if the text is shorter."""
    ids = target.tokenizer(text[: prefix_tokens * _CHARS_PER_TOKEN_MAX])["input_ids"]
    return [int(i) for i in ids[:prefix_tokens]] if len(ids) >= prefix_tokens else None


def _fit(target, prefix_tokens: int, max_new_tokens: int) -> int:
    """Clamp a prefix so prompt + output fits in the target's context (8k prefixes on an 8k model)."""
    return max(1, min(prefix_tokens, target.max_context - max_new_tokens - 1))


# ----- held-out standard library ------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)  # walking the standard library takes a second; every stdlib set needs it
def heldout_stdlib_modules() -> tuple[str, ...]:
    """Held-out stdlib module paths (relative to the stdlib root) in stable order."""
    held = [m for m in stdlib_modules() if split_of(m) == "heldout" and not m.startswith(_SKIP_PREFIXES)]
    return tuple(stable_order(held))


def _read_module(module: str) -> str | None:
    try:
        return (stdlib_root() / module).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _prefix_prompts(set_name: str, target, n: int, prefix: int, min_tokens: int) -> list[BenchPrompt]:
    """Prefixes of the first n held-out modules (stable order) that have at least min_tokens tokens."""
    out: list[BenchPrompt] = []
    for module in heldout_stdlib_modules():
        if len(out) >= n:
            break
        text = _read_module(module)
        ids = _raw_prefix(target, text, max(prefix, min_tokens)) if text else None
        if ids is not None:
            out.append(BenchPrompt(set_name, f"{module}:{prefix}", module, tuple(ids[:prefix]), chat=False))
    return out


def build_code(target, n: int, max_new_tokens: int) -> list[BenchPrompt]:
    prefix = _fit(target, CODE_PREFIX_TOKENS, max_new_tokens)
    # Files shorter than prefix + output would end mid-answer: the target would be continuing past EOF.
    return _prefix_prompts("code", target, n, prefix, prefix + max_new_tokens)


def _build_long(set_name: str) -> Callable:
    def build(target, n: int, max_new_tokens: int) -> list[BenchPrompt]:
        prefix = _fit(target, LONG_PREFIX_TOKENS[set_name], max_new_tokens)
        # Every long set draws from files long enough for the longest one, so 2k/4k/8k share their files.
        longest = _fit(target, max(LONG_PREFIX_TOKENS.values()), max_new_tokens)
        return _prefix_prompts(set_name, target, n, prefix, longest)

    return build


def cut_points(target, n: int, max_new_tokens: int) -> list[tuple[str, int, list[int]]]:
    """(module, cut, the module's tokens) for the first n cut points: every big held-out module (stable order)
    is cut at its first token past the longest ctx context, then every CUT_STRIDE_TOKENS further while the
    continuation still fits; modules take turns (each module's first cut, then each one's second, ...), so the
    prompts spread over as many files as there are."""
    longest = _fit(target, max(CUT_CONTEXT_TOKENS.values()), max_new_tokens)
    per_module = []
    for module in heldout_stdlib_modules():
        text = _read_module(module)
        if not text or len(text) < longest:  # fewer characters than tokens needed: cannot be long enough
            continue
        ids = [int(i) for i in target.tokenizer(text)["input_ids"]]
        cuts = list(range(longest, len(ids) - max_new_tokens + 1, CUT_STRIDE_TOKENS))
        if cuts:
            per_module.append((module, cuts, ids))
    out = []
    for turn in range(max((len(c) for _, c, _ in per_module), default=0)):
        out += [(module, cuts[turn], ids) for module, cuts, ids in per_module if turn < len(cuts)]
    return out[:n]


def _build_cut(set_name: str) -> Callable:
    def build(target, n: int, max_new_tokens: int) -> list[BenchPrompt]:
        context = _fit(target, CUT_CONTEXT_TOKENS[set_name], max_new_tokens)
        # The item id names the cut, not the set: the same id in every ctx set is the same continuation.
        return [BenchPrompt(set_name, f"{module}@{cut}", module, tuple(ids[cut - context : cut]), chat=False)
                for module, cut, ids in cut_points(target, n, max_new_tokens)]

    return build


# ----- HumanEval -----------------------------------------------------------------------------------------
def build_humaneval(target, n: int, max_new_tokens: int) -> list[BenchPrompt]:
    problems = humaneval_problems()
    task_ids = sorted(problems, key=lambda t: int(t.split("/")[-1]))
    # Evenly spaced over the 164 tasks: early HumanEval tasks are easier than late ones.
    picks = sorted({task_ids[i * len(task_ids) // n] for i in range(min(n, len(task_ids)))}, key=task_ids.index)
    out = []
    for task in picks:
        text = HUMANEVAL_TEMPLATE.format(prompt=problems[task]["prompt"])
        out.append(BenchPrompt("humaneval", task, task, tuple(target.encode_prompt(text, chat=None)), chat=True))
    return out


# ----- held-out chat prompts ----------------------------------------------------------------------------
def build_chat(target, n: int, max_new_tokens: int) -> list[BenchPrompt]:
    prompts = [p for p in build_prompts("heldout", long_chars=0) if p.kind in ("complete", "write")]
    by_id = {f"{p.module}:{p.kind}:{hashlib.sha256(p.text.encode()).hexdigest()[:8]}": p for p in prompts}
    out = []
    for item_id in stable_order(by_id)[:n]:
        p = by_id[item_id]
        out.append(BenchPrompt("chat", item_id, p.module, tuple(target.encode_prompt(p.text, chat=None)), chat=True))
    return out


# ----- prose ---------------------------------------------------------------------------------------------
def build_prose(target, n: int, max_new_tokens: int) -> list[BenchPrompt]:
    descriptions = package_descriptions()
    prefix = _fit(target, PROSE_PREFIX_TOKENS, max_new_tokens)
    out = []
    for name in stable_order(descriptions):
        if len(out) >= n:
            break
        ids = _raw_prefix(target, descriptions[name], prefix)
        if ids is not None:
            out.append(BenchPrompt("prose", f"{name}:{prefix}", name, tuple(ids), chat=False))
    return out


# ----- chat written unlike the training templates ------------------------------------------------------------
CHAT_WILD = Path(__file__).resolve().parent.parent / "assets" / "bench" / "chat_wild.jsonl"


def build_chat_wild(target, n: int, max_new_tokens: int) -> list[BenchPrompt]:
    """The first n conversations of CHAT_WILD (OpenAI-style messages, the last one the user's), through the
    target's chat template; a model without one reads the turns as plain text, a blank line apart."""
    items = [json.loads(line) for line in CHAT_WILD.read_text(encoding="utf-8").splitlines() if line.strip()]
    chat = bool(getattr(target.tokenizer, "chat_template", None))

    def encode(messages: list[dict]) -> tuple[int, ...]:
        if chat:
            return tuple(target.encode_chat(messages))
        return tuple(target.encode_prompt("\n\n".join(m["content"] for m in messages), chat=False))

    return [BenchPrompt("chat-wild", item["id"], "chat_wild.jsonl", encode(item["messages"]), chat=chat)
            for item in items[:n]]


# ----- the never-slower suite ------------------------------------------------------------------------------
SUITE_CONTEXTS = (128, 1536, 6144)  # prompt tokens of each prose and code prompt
SUITE_CHAT = (
    "Write a small Python class `RateLimiter` whose `allow()` method returns True at most n times per second.",
    "Write a Python function that parses a duration like '1h30m' or '45s' into seconds.",
)


def _longest_first(texts: dict[str, str], target, tokens: int, exclude: set[str]) -> tuple[str, list[int]] | None:
    """The first text (stable order) with at least `tokens` tokens that is not in `exclude`: its name and prefix."""
    for name in stable_order(texts):
        if name not in exclude:
            ids = _raw_prefix(target, texts[name], tokens)
            if ids is not None:
                return name, ids
    return None


def build_never_slower(target, n: int, max_new_tokens: int) -> list[BenchPrompt]:
    """One prose and one code prompt per SUITE_CONTEXTS length (each from another document), then the chat
    requests; n caps the prompts per kind."""
    out: list[BenchPrompt] = []
    for kind, texts in (("prose", package_descriptions()), ("code", heldout_package_sources(min_chars=4000))):
        used: set[str] = set()
        for tokens in SUITE_CONTEXTS[:n]:
            prefix = _fit(target, tokens, max_new_tokens)
            found = _longest_first(texts, target, prefix + max_new_tokens, used)
            if found:
                used.add(found[0])
                out.append(BenchPrompt("never-slower", f"{kind}:{found[0]}:{prefix}", found[0],
                                       tuple(found[1][:prefix]), chat=False))
    for i, text in enumerate(SUITE_CHAT[:n]):
        out.append(BenchPrompt("never-slower", f"chat:{i}", "suite", tuple(target.encode_prompt(text)), chat=True))
    return out


SETS: dict[str, EvalSet] = {
    s.name: s
    for s in [
        EvalSet("humaneval", "HumanEval prompts, chat template", 150, build_humaneval),
        EvalSet("chat", "held-out stdlib functions to complete or write, chat template", 200, build_chat),
        EvalSet("code", "held-out stdlib modules, 1k-token prefix", CODE_PREFIX_TOKENS, build_code),
        *[
            EvalSet(name, f"held-out big stdlib modules, {tokens // 1024}k-token prefix", tokens, _build_long(name))
            for name, tokens in LONG_PREFIX_TOKENS.items()
        ],
        EvalSet("prose", "package README text from dist-info", PROSE_PREFIX_TOKENS, build_prose),
        EvalSet("chat-wild", "hand-written chat requests for code, unlike the training templates", 120,
                build_chat_wild),
        *[
            EvalSet(name, f"the {tokens // 1024}k tokens before cut points in big held-out stdlib modules", tokens,
                    _build_cut(name))
            for name, tokens in CUT_CONTEXT_TOKENS.items()
        ],
        EvalSet("never-slower", "prose, code and chat at 128 to 6k tokens of context, held out",
                SUITE_CONTEXTS[-1], build_never_slower),
    ]
}

# What `hyflash bench` runs without --sets: every set but the ctx ones (for the kinds grid, issue 41) and the
# never-slower suite (its own command: experiments/never_slower/).
DEFAULT_SETS = tuple(name for name in SETS if name not in CUT_CONTEXT_TOKENS and name != "never-slower")


def load_set(name: str, target, n: int, max_new_tokens: int) -> list[BenchPrompt]:
    if name not in SETS:
        raise HyflashError(f"unknown evaluation set {name!r}: choose from {', '.join(SETS)}")
    if target.tokenizer is None:
        raise HyflashError(f"the target {target.name} has no tokenizer: evaluation sets are text")
    prompts = SETS[name].build(target, n, max_new_tokens)
    if not prompts:
        raise HyflashError(f"evaluation set {name!r} found no prompts on this machine")
    return prompts
