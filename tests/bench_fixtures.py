"""A tiny target that can read text: the tiny random Llama plus a word-hashing tokenizer.

Evaluation sets are text, and the tiny test models have no tokenizer. Hashing words keeps prompts short
(a HumanEval prompt fits the tiny model's 512-token context) and deterministic.
"""

from __future__ import annotations

import zlib

from conftest import tiny_llama


class WordTokenizer:
    chat_template = None  # so HFTarget.encode_prompt tokenises chat prompts as raw text

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, text: str) -> dict:
        return {"input_ids": [zlib.crc32(w.encode()) % self.vocab for w in text.split()]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


def word_target():
    from hyflash.targets import HFTarget

    model = tiny_llama()
    return HFTarget(model, WordTokenizer(model.config.vocab_size), name="tiny-llama-words")
