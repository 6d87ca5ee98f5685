"""Students and teachers for distillation.

A capacity-constrained student is cut from a model: its first N decoder layers, the final norm and the
(tied) head, so it starts with the teacher's vocabulary and representations but far less depth. Students
are saved as ordinary Hugging Face folders (config + safetensors) so any of them can later serve as a
teacher (self-distillation) or as a target.
"""

from __future__ import annotations

import copy
import re
import string
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from hyflash.errors import HyflashError
from hyflash.targets import DTYPES, HFTarget, resolve_model_path

FIRST_LAYERS = re.compile(r"^first-(\d+)(?::(.+))?$")


def truncate_layers(model, num_layers: int):
    """A copy of `model` keeping its first `num_layers` decoder layers (embedding, final norm and head kept)."""
    text_config = model.config.get_text_config()
    total = int(text_config.num_hidden_layers)
    if not 1 <= num_layers <= total:
        raise HyflashError(f"a student keeps 1..{total} layers of this model, got {num_layers}")
    student = copy.deepcopy(model)
    decoder = student.get_decoder()
    decoder.layers = decoder.layers[:num_layers]
    text_config = student.config.get_text_config()
    text_config.num_hidden_layers = num_layers
    if getattr(text_config, "layer_types", None):  # Gemma-style per-layer attention kinds
        text_config.layer_types = list(text_config.layer_types)[:num_layers]
    return student


def load_model(spec: str, dtype: str = "float32"):
    """(model, tokenizer) for a built-in name or a folder; 'first-N[:MODEL]' cuts the first N layers
    (MODEL defaults to the default target)."""
    if dtype not in DTYPES:
        raise HyflashError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    m = FIRST_LAYERS.match(spec)
    if m:
        base, tokenizer = load_model(m.group(2) or "smollm2-135m", dtype)
        return truncate_layers(base, int(m.group(1))), tokenizer
    if spec in ("smollm2-135m", "gemma3-270m"):  # built-ins convert once through the target adapter
        target = HFTarget.load(spec, dtype=dtype)
        return target.model, target.tokenizer
    path = resolve_model_path(spec)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    return model.eval(), AutoTokenizer.from_pretrained(path)


def freeze_embeddings(model) -> None:
    """Keep the (tied) embedding and head frozen: the student learns its transformer layers only, which
    also saves the costly weight gradient of the 49k-row head on a CPU."""
    model.get_input_embeddings().weight.requires_grad_(False)
    head = model.get_output_embeddings()
    if head is not None:
        head.weight.requires_grad_(False)


def save_model(model, tokenizer, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)  # safetensors; tied weights handled by transformers
    tokenizer.save_pretrained(folder)


def same_vocabulary(tok_a, tok_b) -> bool:
    return len(tok_a) == len(tok_b) and tok_a.get_vocab() == tok_b.get_vocab()



# ----- tiny stand-ins (tests and the experiment's tiny scale) --------------------------------------------
TASK_CHARACTERS = list(dict.fromkeys(" \n0123456789+-=.,:QAnswer"))  # every character the tasks write


def char_tokenizer(size: int = 97, width: int = 1):
    """An offline fast tokenizer over characters (width 1) or character pairs (width 2): two vocabularies
    that cut the same text differently (the cross-vocabulary tests), with pad and eos but no bos."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>"]
    core = TASK_CHARACTERS
    if width == 1:
        extra = [c for c in string.ascii_letters + string.punctuation if c not in core]
        units = (core + extra)[: size - len(specials)]
    else:
        units = core + [a + b for a in core for b in core]
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + units)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]{1,%d}" % width), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def save_tiny_model(folder: Path, layers: int = 4, hidden: int = 32, seed: int = 0, width: int = 1) -> Path:
    """A tiny random Llama over `char_tokenizer(width=width)`, saved as a model folder: a stand-in for SmolLM2
    (width 1) or for a model with another vocabulary (width 2) that every stage of the experiment can
    fine-tune, cut and distil in milliseconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = char_tokenizer(width=width)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    save_model(LlamaForCausalLM(config).float().eval(), tokenizer, folder)
    return folder
