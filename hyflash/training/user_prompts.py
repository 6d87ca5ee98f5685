"""The user's own prompts for `hyflash data --prompts FILE`, in the formats people have.

Three formats, told apart by the file's first non-blank line:

  OpenAI JSONL    one object a line: {"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...]}
  ShareGPT JSONL  one object a line: {"conversations": [{"from": "system"|"human"|"gpt", "value": ...}, ...]}
  plain text      anything else: one prompt a line (a single user turn)

A conversation is kept whole: its system message, and every earlier user and assistant turn as written. The
prompt is its last user turn; assistant turns after it are dropped (that answer is what the target writes
itself). Every prompt goes through the target's chat template. Bad input gets one error naming the line.
"""

from __future__ import annotations

import json
from pathlib import Path

from hyflash.errors import HyflashError
from hyflash.files import atomic_write_bytes
from hyflash.corpora import Prompt

FORMATS = ('JSONL of {"messages": [{"role": ..., "content": ...}]} (OpenAI), JSONL of '
           '{"conversations": [{"from": "human"|"gpt", "value": ...}]} (ShareGPT), or plain text with one prompt '
           'a line')
# Speaker names each format uses, mapped to the chat template's roles.
_ROLES = {"system": "system", "developer": "system", "user": "user", "human": "user",
          "assistant": "assistant", "gpt": "assistant", "model": "assistant", "chatgpt": "assistant", "bing": "assistant"}
_KEYS = {"messages": ("role", "content"), "conversations": ("from", "value")}


def _conversation(turns, keys: tuple[str, str], where: str) -> Prompt:
    """One conversation as a Prompt: system text, alternating history, last user turn."""
    speaker_key, text_key = keys
    if not isinstance(turns, list) or not turns:
        raise HyflashError(f"{where}: the conversation is not a non-empty list of turns; expected {FORMATS}")
    roles, texts = [], []
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict) or speaker_key not in turn or not isinstance(turn.get(text_key), str):
            raise HyflashError(f"{where}: turn {k + 1} needs a {speaker_key!r} and a string {text_key!r}; "
                               f"expected {FORMATS}")
        role = _ROLES.get(str(turn[speaker_key]).lower())
        if role is None:
            raise HyflashError(f"{where}: turn {k + 1} has the unknown speaker {turn[speaker_key]!r} "
                               f"(known: {', '.join(sorted(_ROLES))})")
        roles.append(role)
        texts.append(turn[text_key])
    system = ""
    if roles[0] == "system":
        system, roles, texts = texts[0], roles[1:], texts[1:]
    while roles and roles[-1] == "assistant":  # the reply the target will write itself
        roles, texts = roles[:-1], texts[:-1]
    if not roles:
        raise HyflashError(f"{where}: the conversation has no user turn to answer")
    expected = ["user", "assistant"] * len(roles)
    if roles != expected[: len(roles)]:
        bad = next(k for k, (r, e) in enumerate(zip(roles, expected)) if r != e)
        raise HyflashError(f"{where}: turns must alternate user, assistant after an optional first system message "
                           f"(turn {bad + 1 + bool(system)} is {roles[bad]!r}, expected {expected[bad]!r})")
    if not texts[-1].strip():
        raise HyflashError(f"{where}: the last user turn is empty")
    return Prompt("user", where, texts[-1], history=tuple(texts[:-1]), system=system)


def _json_prompt(line: str, where: str) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise HyflashError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); a JSONL file needs one "
                           f"JSON object a line; expected {FORMATS}") from exc
    found = [key for key in _KEYS if isinstance(obj, dict) and key in obj]
    if len(found) != 1:
        raise HyflashError(f"{where}: an object with one of the keys 'messages' or 'conversations' is needed; "
                           f"expected {FORMATS}")
    return _conversation(obj[found[0]], _KEYS[found[0]], where)


def read_prompt_file(path: str | Path) -> list[Prompt]:
    """Every prompt of a user's file, in file order (blank lines skipped)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HyflashError(f"no prompt file at {path}: pass an existing file to --prompts") from None
    except UnicodeDecodeError as exc:
        raise HyflashError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); expected {FORMATS}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise HyflashError(f"{path} holds no prompts; expected {FORMATS}")
    # JSONL if the first line is an object; a plain-text file may still hold a line that looks like one later.
    if lines[0][1].lstrip().startswith("{"):
        return [_json_prompt(line, f"{path}:{n}") for n, line in lines]
    return [Prompt("user", f"{path}:{n}", line.strip()) for n, line in lines]


def write_prompt_file(path: str | Path, prompts: list[Prompt]) -> int:
    """Chat prompts as OpenAI-style JSONL (what read_prompt_file reads back); raw-continuation kinds, which have
    no chat form, are left out. Returns how many were written."""
    rows = []
    for p in prompts:
        if not p.chat:
            continue
        messages = [{"role": "system", "content": p.system}] if p.system else []
        messages += [{"role": ("user", "assistant")[k % 2], "content": t} for k, t in enumerate(p.history)]
        messages.append({"role": "user", "content": p.text})
        rows.append(json.dumps({"messages": messages, "kind": p.kind, "source": p.module}, ensure_ascii=False))
    atomic_write_bytes(Path(path), ("\n".join(rows) + "\n").encode())
    return len(rows)
