"""The evaluation-set registry: deterministic, held out from training, the right shapes."""

from __future__ import annotations

import pytest

from hyflash.bench.datasets import LONG_PREFIX_TOKENS, SETS, SUITE_CONTEXTS, heldout_stdlib_modules, load_set
from hyflash.errors import HyflashError
from hyflash.corpora import prose_prompts, split_of, stdlib_modules

from bench_fixtures import word_target

MAX_NEW = 16


@pytest.fixture(scope="module")
def target():
    return word_target()


@pytest.mark.parametrize("name", [s for s in SETS if s != "never-slower"])
def test_sets_are_deterministic_and_extend(target, name):
    three = load_set(name, target, 3, MAX_NEW)
    again = load_set(name, target, 3, MAX_NEW)
    five = load_set(name, target, 5, MAX_NEW)
    assert three == again
    assert len(three) == 3 and len({p.item_id for p in three}) == 3
    if name != "humaneval":  # HumanEval spreads n picks evenly over its tasks, so n changes the spacing
        assert five[:3] == three
    for p in three:
        assert p.set_name == name and p.ids
        assert all(0 <= i < target.vocab_size for i in p.ids)
        assert len(p.ids) + MAX_NEW < target.max_context


def test_stdlib_sets_use_only_heldout_modules(target):
    training = {m for m in stdlib_modules() if split_of(m) == "train"}
    assert training and not training & set(heldout_stdlib_modules())
    for name in ["code", "chat", *LONG_PREFIX_TOKENS]:
        for p in load_set(name, target, 4, MAX_NEW):
            assert split_of(p.source) == "heldout" and p.source not in training


def test_long_sets_share_files_and_grow(target):
    sets = [load_set(name, target, 3, MAX_NEW) for name in LONG_PREFIX_TOKENS]
    assert len({tuple(p.source for p in s) for s in sets}) == 1  # same files: only the context length varies
    for shorter, longer in zip(sets, sets[1:]):
        for a, b in zip(shorter, longer):
            assert len(a.ids) <= len(b.ids) and b.ids[: len(a.ids)] == a.ids


def test_humaneval_is_chat_and_prose_is_not_stdlib(target):
    assert all(p.chat and p.source.startswith("HumanEval/") for p in load_set("humaneval", target, 4, MAX_NEW))
    stdlib = set(stdlib_modules())
    assert all(not p.chat and p.source not in stdlib for p in load_set("prose", target, 4, MAX_NEW))


def test_chat_set_is_heldout_chat_prompts_that_complete_or_write_functions(target):
    prompts = load_set("chat", target, 6, MAX_NEW)
    assert all(p.chat and p.item_id.split(":")[1] in ("complete", "write") for p in prompts)
    assert {p.item_id.split(":")[1] for p in load_set("chat", target, 200, MAX_NEW)} == {"complete", "write"}


def test_unknown_set_is_a_clear_error(target):
    with pytest.raises(HyflashError, match="unknown evaluation set"):
        load_set("nope", target, 1, MAX_NEW)


def test_the_never_slower_suite_spans_contexts_and_kinds_from_held_out_sources(target):
    suite = load_set("never-slower", target, 3, MAX_NEW)
    assert suite == load_set("never-slower", target, 3, MAX_NEW)
    kinds = [p.item_id.split(":")[0] for p in suite]
    assert kinds.count("chat") == 2 and kinds.count("prose") == kinds.count("code") >= 1
    long = [len(p.ids) for p in suite if not p.chat]
    assert min(long) <= 128 and max(long) == min(SUITE_CONTEXTS[-1], target.max_context - MAX_NEW - 1)
    # Code from packages whose code and docstrings training never read; prose from READMEs it never reads.
    code = {p.source.split("/")[0] for p in suite if p.item_id.startswith("code")}
    assert code and all(split_of(f"package:{name}") == "heldout" for name in code)
    prose = {p.source for p in suite if p.item_id.startswith("prose")}
    assert prose and not prose & {pr.module.split("/")[0].removeprefix("package:")
                                  for pr in prose_prompts("train", per_package=1)}


def test_chat_wild_is_hand_written_with_earlier_turns_and_unlike_every_training_prompt(target):
    """Issue 37's held-out generalisation set: none of its requests occurs in the prompts the drafters train on
    (the varied source, both splits), and some carry earlier turns."""
    import json

    from hyflash.bench.datasets import CHAT_WILD
    from hyflash.training.varied_prompts import varied_prompts

    wild = [json.loads(line) for line in CHAT_WILD.read_text(encoding="utf-8").splitlines()]
    prompts = load_set("chat-wild", target, len(wild), MAX_NEW)
    assert len(prompts) == len(wild) == 24 and len({p.item_id for p in prompts}) == 24
    assert sum(len(w["messages"]) > 1 for w in wild) >= 2
    assert all(w["messages"][-1]["role"] == "user" for w in wild)
    training = "\n".join(p.text for split in ("train", "heldout") for p in varied_prompts(split))
    assert len(training) > 100_000
    for w in wild:
        for m in w["messages"]:
            assert m["content"] not in training
