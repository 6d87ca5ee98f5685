"""The transformers backend: any Hugging Face causal LM behind the Target interface (see base.py).

Nothing here is model-specific. The adapter owns one key/value cache (batch 1); features are recorded by
forward hooks on the feature layers. It is the backend for training (it exposes `model`) and for non-GGUF
models; `HFTarget.load` converts a built-in model's GGUF once into safetensors.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import shutil
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from hyflash.errors import HyflashError
from hyflash.targets import linear
from hyflash.targets.attention import NAME as ATTENTION_NAME
from hyflash.targets.attention import use_for
from hyflash.targets.base import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    BaseTarget,
    TargetOutput,
    builtin_gguf,
    cache_root,
    default_feature_layers,
)
from hyflash.targets.growing_cache import growing_cache
from hyflash.targets.prefill_reuse import PrefillRecord, begin_prefill

PREFILL_CHUNK = 2048  # prompt tokens per prefill pass: bounds activation memory for long prompts
# glibc's malloc: mallopt's parameters, and the threshold below which (by default, once large blocks have been
# freed) blocks come from the heap. 32 MiB is the most glibc raises it to by itself.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, HEAP_BLOCKS_UP_TO = -1, -3, 32 << 20
# Free memory at the heap's top that glibc keeps instead of returning it: what its own dynamic rule would set
# (twice the mmap threshold), which setting M_MMAP_THRESHOLD switches off. Left at the 128 KiB default, every
# decode step at a long context gave back the blocks its cache copy had freed and faulted them in again: a
# 2-token pass at 6k tokens took 390 ms instead of 190 (fp32, AMD EPYC; docs/engine.md, "Few-query attention").
HEAP_KEPT_FREE = 2 * HEAP_BLOCKS_UP_TO


@contextmanager
def large_blocks_mapped(threshold: int = 1 << 20):
    """Within the block, glibc serves blocks of `threshold` bytes or more with their own memory maps, returned to
    the system when freed; after it, blocks up to HEAP_BLOCKS_UP_TO come from the heap again.

    Why: a chunked prefill grows every layer's cached keys and values chunk by chunk (a new, larger buffer
    each), so each chunk frees 60 blocks (SmolLM2) a little smaller than the ones it takes; on the heap those
    holes stay resident and fit nothing later: +0.17 GB peak RSS at 4k prompt tokens in fp32. Mapped, they go
    back at once (peak 1.33 -> 1.17 GB). Only around the prefill: when decode steps copied the whole cache
    (transformers' DynamicCache, before targets/growing_cache.py), faulting fresh maps in for that every step made
    steps ~1.4x slower (MALLOC_MMAP_THRESHOLD_ for the whole run; AMD EPYC, 4k context). A no-op where the C
    library is not glibc."""
    mallopt = _glibc_mallopt()
    if mallopt is None:
        yield
        return
    mallopt(M_MMAP_THRESHOLD, threshold)
    try:
        yield
    finally:
        mallopt(M_MMAP_THRESHOLD, HEAP_BLOCKS_UP_TO)
        mallopt(M_TRIM_THRESHOLD, HEAP_KEPT_FREE)


@functools.lru_cache(maxsize=1)
def _glibc_mallopt():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_model_path(name_or_path: str) -> Path:
    """Return a local folder with a saved HF model: a built-in name (converted once and cached) or a path."""
    if name_or_path in BUILTIN_MODELS:
        out = cache_root() / "models" / name_or_path
        if (out / "config.json").exists():
            return out
        folder, gguf_file = builtin_gguf(name_or_path)
        convert_gguf(folder, gguf_file, out)
        return out
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").exists():
        known = ", ".join(BUILTIN_MODELS)
        raise HyflashError(
            f"unknown model {name_or_path!r}: not a built-in name ({known}) nor a folder with a config.json"
        )
    return path


def convert_gguf(folder: Path, gguf_file: str, out: Path) -> None:
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
        return torch.stack([parts[0] if len(parts) == 1 else torch.cat(parts, dim=1) for parts in self.calls], dim=2)


def hf_identity(dtype: str) -> dict:
    """The transformers backend's part of a calibration key for `dtype` (see HFTarget.identity)."""
    # The attention a CPU target runs (see targets/attention.py): curves of the old kernels are stale.
    attention = ATTENTION_NAME if dtype in ("bfloat16", "float16") else f"{ATTENTION_NAME}-shared-kv"
    # The cache written in place (targets/growing_cache.py): curves timed on transformers' copying cache are stale.
    identity = {"backend": "transformers", "transformers": transformers.__version__, "attention": attention,
                "cache": "growing"}
    if dtype == "float32":  # verify passes' linears (targets/linear.py)
        identity["linear"] = linear.KERNEL
    return identity


class HFTarget(BaseTarget):
    """A causal LM with a batch-1 cache. Build with `HFTarget.load(...)` or wrap an existing model."""

    backend = "transformers"

    def __init__(self, model, tokenizer=None, feature_layers: tuple[int, ...] | None = None, name: str = ""):
        self.model = model.eval()
        use_for(self.model)  # on CPU: few-query passes skip SDPA's slow bf16 kernel and fp32 key/value copies
        linear.use_for(self.model)  # on CPU in fp32: verify passes take the few-rows kernel
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "") or model.config.model_type
        text_config = model.config.get_text_config()
        self.num_layers = int(text_config.num_hidden_layers)
        self.hidden_size = int(text_config.hidden_size)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_context = int(getattr(text_config, "max_position_embeddings", 1 << 30))
        self.feature_layers = tuple(feature_layers or default_feature_layers(self.num_layers))
        self._check_feature_layers()
        self.eos_token_ids = self._eos_ids()
        self.cache = growing_cache()
        self._prefilled: PrefillRecord | None = None  # the cache's last prefill (targets/prefill_reuse.py)
        # A sliding-window layer keeps only its window, so an earlier prompt's cells cannot be kept (Gemma-3).
        self._reuses_prompts = "sliding_attention" not in (getattr(text_config, "layer_types", None) or [])

    @classmethod
    def load(
        cls, name_or_path: str = DEFAULT_MODEL, dtype: str = "bfloat16", feature_layers=None
    ) -> "HFTarget":
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

    def identity(self) -> dict:
        return hf_identity(self.precision)

    def load_sibling(self, name_or_path: str) -> "HFTarget":
        return HFTarget.load(name_or_path, dtype=self.precision)

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

    # ----- frozen pieces drafters reuse --------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    # ----- cached forward passes -----------------------------------------------------------------------
    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = growing_cache()
        self._prefilled = None

    def kv_bytes(self) -> int:
        """Every tensor of every cache layer."""
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for tensor in vars(layer).values():
                if isinstance(tensor, torch.Tensor):
                    total += tensor.numel() * tensor.element_size()
        return total

    @torch.inference_mode()
    def prefill(self, ids, features: bool = True, feature_free: bool = False, on_features=None,
                resumable=None, chunk: int = PREFILL_CHUNK) -> TargetOutput:
        """Start a new sequence: run the prompt, `chunk` tokens per pass.

        Only the last position's logits are returned ([1, V]): nothing reads the others, and for a long prompt
        they would be most of the memory (7.5k positions x 49k vocabulary x 4 bytes = 1.5 GB for SmolLM2).
        Chunking bounds the activations of one pass whatever the prompt length; features cover every position,
        each chunk's copied into one tensor as it comes (gathering the chunks' and concatenating them would hold
        the prompt's features twice: 2 x 86 MB for 7.5k SmolLM2 positions in fp32), or handed to `on_features`
        chunk by chunk and not returned (see BaseTarget.prefill).
        The whole chunks the prompt shares with the last prefill are kept, not run again, with a drafter fed
        the features restored to its snapshot there (targets/prefill_reuse.py; `reused_tokens` says how many):
        the same prompt again costs nothing, a prompt longer than a chunk that extends the last one only its new
        chunks, and the logits are a fresh prefill's bit for bit.
        """
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device)
        length = ids.shape[-1]
        self.check_prompt_length(length)
        features = features or on_features is not None
        keep, record, logits = begin_prefill(
            self._prefilled, [int(i) for i in ids.view(-1).tolist()], chunk, features, on_features, resumable,
            self.rollback, self.reset, reusable=self._reuses_prompts)
        self.reused_tokens, feats = keep, None
        if features and on_features is None:
            feats = torch.empty(length, len(self.feature_layers), self.hidden_size, dtype=self.dtype, device=self.device)
        with large_blocks_mapped():
            for i in range(keep, length, chunk):
                part = self._forward(ids[i : i + chunk], features, last_logits_only=True)
                logits = part.logits
                if on_features is not None:
                    on_features(ids[i : i + chunk], part.features)
                elif features:
                    feats[i : i + chunk] = part.features
                record.after_chunk(min(i + chunk, length), resumable)
        record.logits = logits[-1:].clone()
        self._prefilled = record
        return TargetOutput(logits=logits[-1:], features=feats)

    @torch.inference_mode()
    def score(self, ids, features: bool = True, tree=None) -> TargetOutput:
        """Run a block of tokens on top of the cache; logits/features for every block position (a draft tree
        through a 4-D mask and explicit positions, see HFTarget.score)."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device)
        if self.cache_length + ids.shape[-1] > self.max_context:
            raise HyflashError(f"sequence would exceed the model's context of {self.max_context} tokens")
        with linear.verify_passes():
            if tree is None:
                return self._forward(ids, features)
            mask, positions = self._tree_mask(*tree)
            return self._forward(ids, features, attention_mask=mask, position_ids=positions)

    def _tree_mask(self, ancestors: torch.Tensor, offsets: torch.Tensor):
        """A boolean [1, 1, q, past + q] mask (True = may attend) and positions [1, q] for a tree block; for
        models with sliding-window layers (Gemma-3) a mask per layer type, bounded by the window in positions."""
        past, q = self.cache_length, ancestors.shape[0]
        device = self.device
        positions = (past + offsets.to(device)).view(1, -1)
        full = torch.cat([torch.ones(q, past, dtype=torch.bool, device=device), ancestors.to(device)], dim=1)
        config = self.model.config.get_text_config()
        if "sliding_attention" not in (getattr(config, "layer_types", None) or []):
            return full[None, None], positions
        key_positions = torch.cat([torch.arange(past, device=device), positions[0]])
        sliding = full & ((positions[0][:, None] - key_positions[None, :]) < config.sliding_window)
        return {"full_attention": full[None, None], "sliding_attention": sliding[None, None]}, positions

    def _keep_entries(self, start: int, kept: list[int]) -> None:
        """Compact every layer's cached keys/values to [0, start) + the kept block entries."""
        if self._prefilled is not None:
            self._prefilled.cut(start)
        index = torch.tensor(kept, device=self.device) + start
        for layer in self.cache.layers:
            if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
                raise HyflashError(f"{type(layer).__name__} caches cannot be compacted to a tree path: use --tree 0")
            layer.keys = torch.cat([layer.keys[:, :, :start], layer.keys.index_select(2, index)], dim=2)
            layer.values = torch.cat([layer.values[:, :, :start], layer.values.index_select(2, index)], dim=2)

    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached tokens."""
        self._check_rollback(length)
        current = self.cache_length
        if length < current:
            self.cache.crop(length - current)  # transformers 5: a negative count removes that many tokens
            if self._prefilled is not None:
                self._prefilled.cut(length)

    def _forward(self, ids: torch.Tensor, features: bool, last_logits_only: bool = False, **tree) -> TargetOutput:
        # Hooks keep only the feature layers (output_hidden_states would keep all of them).
        recorder = FeatureRecorder(self) if features else nullcontext()
        with recorder:
            out = self.model(
                input_ids=ids.view(1, -1),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1 if last_logits_only else 0,
                **tree,
            )
        self.cache = out.cache
        feats = recorder.features()[0] if features else None
        return TargetOutput(logits=out.logits[0].float(), features=feats)
