"""The llama.cpp backend: a GGUF file behind the Target interface, through llama-cpp-python's low-level API.

Why: on a CPU, llama.cpp decodes the same quantised GGUF 3-5x faster than transformers does its dequantised
copy, so that is the plain decoding speculative decoding has to beat (issue 13).

How, with public calls only:
  - one llama_context with one sequence; a batch marks every scored position as an output, so one
    llama_decode gives logits for every block position (prefill asks for the last one only);
  - features come from the eval callback (llama_context_params.cb_eval): it asks for the tensors
    `l_out-{i-1}` (llama.cpp names layer i's output `l_out-i`; our feature index i, like transformers'
    hidden_states[i], is the output of layer i-1), and copies their float32 rows, every batch position;
  - rollback is llama_memory_seq_rm(mem, 0, length, -1);
  - a prefill reuses the cells of the context's last prefill, in whole BATCH chunks, where the new prompt starts
    with the same tokens (the same prompt again, a chat's next turn): every pass it then runs is one a fresh
    prefill would run, on the same cells, so the numbers are a fresh prefill's on any file; a drafter fed the
    prompt's features is restored to its snapshot where the kept chunks end (`targets/prefill_reuse.py`);
  - a draft tree is one batch: each node carries the sequence ids of every root-to-leaf path through it
    (leaf j is sequence 1 + j, given a copy of the verified text first) at position = its depth, so llama.cpp's
    own causal-per-sequence mask is the ancestor mask. Keeping the accepted path relabels its cells to
    sequence 0 and the rejected ones to a junk sequence that nothing reads (see `_keep_tree_path` for why
    they are not freed), all with llama_memory_seq_cp / seq_rm;
  - the embedding and LM head a drafter borrows are read from the GGUF with the `gguf` package and
    dequantised to float32 once, lazily (the drafter needs them; plain decoding does not).
The tokenizer of a built-in model is the Hugging Face tokenizer the transformers backend uses, so prompts and
chat templates are identical across backends; an arbitrary .gguf uses llama.cpp's own tokenizer.
"""

from __future__ import annotations

import ctypes
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from hyflash.errors import HyflashError
from hyflash.targets import CACHE_TYPES, TREE_LEAVES, llamacpp_gate
from hyflash.targets.base import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    BaseTarget,
    TargetOutput,
    cache_root,
    default_feature_layers,
    gguf_path,
)
from hyflash.targets.llamacpp_build import (
    FLASH_ATTN,
    default_cache_types,
    default_repack,
    file_fingerprint,
    ggml_lib,
    init_backend,
    llama_cpp,
    matmul_kernels,
    model_params,
    two_by_two_kernels,
)
from hyflash.targets.llamacpp_settings import searched_options
from hyflash.targets.prefill_reuse import PrefillRecord, begin_prefill

DEFAULT_N_CTX = 8192  # enough for every bench context; a model trained on less gets its own
BATCH = 512  # tokens per llama_decode call (prefill chunk), also the physical ubatch
# TREE_LEAVES (targets/__init__.py): most leaves of a draft tree, one sequence each (ids 1..TREE_LEAVES); 0 is the
# verified text
JUNK_SEQ = TREE_LEAVES + 1  # holds rejected tree nodes' cells until they can be dropped without leaving holes
JUNK_LIMIT = 512  # junk cells that trigger a compaction of the cache (their masked scan costs a little per pass)


class LlamaCppTokenizer:
    """llama.cpp's tokenizer behind the few Hugging Face tokenizer calls hyflash makes (for a .gguf that has
    no Hugging Face tokenizer next to it)."""

    def __init__(self, model, vocab):
        self.vocab = vocab
        template = llama_cpp.llama_model_chat_template(model, None)
        self.chat_template = template.decode("utf-8") if template else None
        self.eos_token_id = int(llama_cpp.llama_vocab_eos(vocab))
        self.bos_token_id = int(llama_cpp.llama_vocab_bos(vocab))

    def piece(self, token: int) -> str:
        return llama_cpp.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace") if token >= 0 else ""

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 8
        for _ in range(2):  # a negative count is the size needed
            buf = (llama_cpp.llama_token * size)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, size, add_special, parse_special)
            if n >= 0:
                return [int(t) for t in buf[:n]]
            size = -n
        raise HyflashError("llama.cpp could not tokenize the prompt")

    def __call__(self, text: str) -> dict:
        return {"input_ids": self.encode(text)}

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = True):
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        formatter = Jinja2ChatFormatter(self.chat_template, eos_token=self.piece(self.eos_token_id),
                                        bos_token=self.piece(self.bos_token_id),
                                        add_generation_prompt=add_generation_prompt)
        text = formatter(messages=messages).prompt
        return self.encode_rendered(text) if tokenize else text

    def encode_rendered(self, text: str) -> list[int]:
        """Text the chat template rendered: it writes BOS itself when the model wants one, so add nothing, and
        parse its special tokens."""
        return self.encode(text, add_special=False, parse_special=True)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 8 * len(ids) + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, size, skip_special_tokens,
                                           not skip_special_tokens)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = -n
        raise HyflashError("llama.cpp could not detokenize")


@dataclass
class _TreeBlock:
    """A draft tree as llama.cpp sees it: each entry's position and sequence ids (the leaves through it)."""

    start: int  # the root's position
    positions: list[int]
    seqs: list[tuple[int, ...]]
    leaf_seqs: list[int]

    @classmethod
    def of(cls, start: int, ancestors: torch.Tensor, offsets: torch.Tensor) -> "_TreeBlock":
        """From the ancestor mask (row i: i, its ancestors and the root) and depth offsets of DraftTree."""
        ancestors = ancestors.bool().cpu()
        leaves = (ancestors.sum(0) == 1).nonzero().view(-1).tolist()  # entries no other entry descends from
        if len(leaves) > TREE_LEAVES:
            raise HyflashError(f"a draft tree with {len(leaves)} leaves is more than the llama.cpp backend's "
                               f"{TREE_LEAVES}: use a smaller --tree")
        seqs = [tuple(1 + j for j, leaf in enumerate(leaves) if ancestors[leaf, i]) for i in range(len(offsets))]
        positions = [start + int(d) for d in offsets.tolist()]
        return cls(start, positions, seqs, [1 + j for j in range(len(leaves))])


def _hf_tokenizer(name: str, folder: Path, gguf_file: str):
    """The tokenizer the transformers backend uses for a built-in model: its cached conversion, else the
    same tokenizer read from the GGUF (what the conversion saves), without converting the weights."""
    from transformers import AutoTokenizer

    converted = cache_root() / "models" / name
    if (converted / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(converted)
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)


class LlamaCppTarget(BaseTarget):
    """A GGUF model run by llama.cpp, batch 1. Build with `LlamaCppTarget.load(name_or_path)`."""

    backend = "llama.cpp"

    def __init__(self, gguf_path: str | Path, tokenizer=None, feature_layers: tuple[int, ...] | None = None,
                 name: str = "", n_ctx: int | None = None, n_threads: int | None = None,
                 flash_attn: bool | None = None, record_features: bool = True,
                 cache_type_k: str = "auto", cache_type_v: str = "auto", repack: bool | None = None,
                 eval_gate: bool | None = None):
        """n_threads None: torch's; flash_attn None: FLASH_ATTN; repack None: `default_repack()` (weights in
        ggml's repacked CPU buffers); eval_gate None: the eval callback's questions answered in C where the gate
        builds (`llamacpp_gate`), True: required, False: the plain Python callback (the reference)."""
        path = Path(gguf_path).expanduser()
        for what, kind in (("cache_type_k", cache_type_k), ("cache_type_v", cache_type_v)):
            if kind != "auto" and kind not in CACHE_TYPES:
                raise HyflashError(f"unknown KV cache type {what}={kind!r}: use auto or one of {', '.join(CACHE_TYPES)}")
        if not path.is_file():
            raise HyflashError(f"no GGUF file at {path}: pass a built-in model name or an existing .gguf file")
        init_backend()
        self.path = path
        self.name = name or path.name
        self._model = self._ctx = None
        mparams = model_params(repack=repack)
        self.repack = bool(mparams.use_extra_bufts)
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise HyflashError(f"llama.cpp could not load {path}: the file is corrupt or not a GGUF model")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.num_layers = int(llama_cpp.llama_model_n_layer(self._model))
        self.hidden_size = int(llama_cpp.llama_model_n_embd(self._model))
        self.vocab_size = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.architecture = self._meta("general.architecture")
        self.tokenizer = tokenizer if tokenizer is not None else LlamaCppTokenizer(self._model, self._vocab)
        self.feature_layers = tuple(feature_layers or default_feature_layers(self.num_layers))
        self._check_feature_layers()
        self.eos_token_ids = self._eos_ids()

        # Which graph tensor holds each feature (index 0, the embedding, is computed here from the GGUF).
        self._tensor_of = {}
        for j, i in enumerate(self.feature_layers):
            if 0 < i < self.num_layers:
                self._tensor_of[f"l_out-{i - 1}".encode()] = j
            elif i == self.num_layers:
                self._tensor_of[b"result_norm"] = j  # hidden_states[L] is the final norm's output
        # The graph keeps only output rows after the last layer: the final norm's rows need every output.
        self._all_outputs = self.num_layers in self.feature_layers
        self._ggml = ggml_lib()
        self._recording = False
        self._parts: list[list[np.ndarray]] = [[] for _ in self.feature_layers]
        self._callback_error: BaseException | None = None
        self._cb = llama_cpp.ggml_backend_sched_eval_callback(self._on_tensor)  # kept alive with self
        self._gate, self._gate_cb = self._make_gate(eval_gate)

        n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self._model))
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = int(n_ctx or min(n_ctx_train, DEFAULT_N_CTX))
        cparams.n_batch = cparams.n_ubatch = BATCH
        # Sequences: the verified text, a draft tree's leaves and the junk one, in one unified cache (a node
        # shared by several leaves is one cell with several sequence ids).
        cparams.n_seq_max = JUNK_SEQ + 1
        cparams.kv_unified = True
        threads = int(n_threads or torch.get_num_threads())
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.no_perf = True
        # Explicit, not llama.cpp's "auto": greedy text depends on it (FA rounds differently), and a plain
        # llama.cpp run compared with this one must use the same setting (llama_cpp.Llama defaults to off).
        # On by default because it makes speculative decoding exact on SmolLM2 Q4_1: with FA (and the q8_0 K
        # below) a q-token pass gives bit for bit the logits of q one-token passes (any context, any thread
        # count); without it, passes of 8+ tokens differ by ~1-2% (argmax flips at q = 16). F16 files round
        # differently in multi-token matrix products at any setting, so near-ties can flip there
        # (experiments/llamacpp/batch_invariance.md). The price: with the eval callback, FA passes of 8-16
        # tokens cost 1.3-1.5x more than without FA (experiments/llamacpp/measure.md).
        self.flash_attn = FLASH_ATTN if flash_attn is None else bool(flash_attn)
        cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn
                                   else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        # "auto" is K in q8_0 for a Q4_1 file because that makes speculative decoding exact on any thread
        # count: a one-token FA pass over 512+ cells with an F16 (or F32) K and V of one type splits the cells
        # across threads and merges partial sums, so it rounds differently from the multi-token pass that
        # verifies a draft; with q8_0 K every pass takes the same per-row path (experiments/llamacpp/
        # kv_cache.md: bit-identical at 2 threads, 300-1,000 tokens, where F16/F16 differs by up to 0.9
        # logits; see default_cache_types for other files). A plain llama.cpp run compared with this one must
        # use the same types, as the bench peers do (llama_cpp_peer).
        auto = default_cache_types(self.precision)
        self.cache_types = (auto[0] if cache_type_k == "auto" else cache_type_k,
                            auto[1] if cache_type_v == "auto" else cache_type_v)
        cparams.type_k, cparams.type_v = (CACHE_TYPES[t] for t in self.cache_types)
        # A sliding-window cache prunes cells it thinks are dead; rollback must find the last block's cells.
        cparams.swa_full = True
        # The callback is asked about every graph node of every pass: through Python, plain decoding is ~9%
        # faster without it (the C gate answers those questions for ~nothing). So a target that never gives
        # features is built without one, and one that does runs a generation prefilled without features in a
        # second context without it (made when first needed; a context's callback cannot be removed).
        self._plain_params = llama_cpp.llama_context_params.from_buffer_copy(cparams)
        if record_features:
            self._set_callback(cparams)
        self.record_features = record_features
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise HyflashError(f"llama.cpp could not create a context of {cparams.n_ctx} tokens for {path}")
        self._feature_ctx, self._plain_ctx = (self._ctx, None) if record_features else (None, self._ctx)
        self.max_context = int(llama_cpp.llama_n_ctx(self._ctx))
        self.threads = threads
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(BATCH, 0, TREE_LEAVES)
        self._length = 0
        self._prefilled: dict[bool, PrefillRecord] = {}  # per context (in the feature one?): its last prefill
        self._junk = 0  # cells of rejected tree nodes still held (in JUNK_SEQ)
        self._tree: _TreeBlock | None = None  # the last scored tree block, until keep() resolves it
        self._weights: dict[str, torch.Tensor] = {}
        self._move_bytes_per_ms = 1e6  # a cache move's speed (drop_features_ms) until one is timed: 1 GB/s
        self._embed_scale = math.sqrt(self.hidden_size) if self.architecture.startswith("gemma") else 1.0

    @classmethod
    def load(cls, name_or_path: str = DEFAULT_MODEL, feature_layers=None, **kwargs) -> "LlamaCppTarget":
        """A built-in name (the GGUF its package ships, with the transformers backend's tokenizer) or a local
        .gguf file (llama.cpp's own tokenizer and chat template). Settings not given in kwargs (threads,
        flash_attn, cache types, repack) come from this machine's cached configuration search for the file,
        if there is one (`hyflash calibrate --search-config`; llamacpp_settings.searched_options)."""
        path = gguf_path(name_or_path)
        tokenizer = _hf_tokenizer(name_or_path, path.parent, path.name) if name_or_path in BUILTIN_MODELS else None
        given = {k: v for k, v in kwargs.items() if v is not None}
        return cls(path, tokenizer, feature_layers, name=str(name_or_path), **(searched_options(path, given) | given))

    def __del__(self) -> None:
        try:
            if getattr(self, "_ctx", None):
                llama_cpp.llama_batch_free(self._batch)
            for ctx in {getattr(self, "_feature_ctx", None), getattr(self, "_plain_ctx", None)} - {None}:
                llama_cpp.llama_free(ctx)
            if getattr(self, "_model", None):
                llama_cpp.llama_model_free(self._model)
        except Exception:  # interpreter shutdown may have torn the bindings down already
            pass
        self._ctx = self._feature_ctx = self._plain_ctx = self._model = None

    def _make_gate(self, wanted: bool | None):
        """The C gate for the eval callback and the C callback to install, or (None, None) for the Python one."""
        if wanted is False:
            return None, None
        lib, why = llamacpp_gate.load()
        if lib is None:
            if wanted:
                raise HyflashError(f"the eval callback's C gate cannot be built: {why}. Install a C compiler, "
                                   "or load the target with eval_gate=False (the Python callback, ~9% slower)")
            return None, None
        gate, address = llamacpp_gate.make_gate(lib, list(self._tensor_of),
                                                ctypes.cast(self._ggml.ggml_get_name, ctypes.c_void_p).value, self._cb)
        return gate, llama_cpp.ggml_backend_sched_eval_callback(address)

    def _set_callback(self, params) -> None:
        """Make a context built with `params` call this target's eval callback (through the gate if it has one)."""
        if self._gate is None:
            params.cb_eval = self._cb
        else:
            params.cb_eval, params.cb_eval_user_data = self._gate_cb, ctypes.addressof(self._gate)

    @property
    def eval_gate(self) -> bool:
        """Whether the eval callback's questions are answered in C (else every graph node calls Python)."""
        return self._gate is not None

    def _use_context(self, feature_free: bool) -> None:
        """At a prefill: the context with the eval callback, unless the sequence is feature-free or the target
        has none; then the one without (made now if needed). Each has its own cache; prefill starts it afresh."""
        self._ctx = self._feature_ctx if self.record_features and not feature_free else self._plain_context()
        self._mem = llama_cpp.llama_get_memory(self._ctx)

    def _plain_context(self):
        """The context without the eval callback, made when first needed."""
        if self._plain_ctx is None:
            self._plain_ctx = llama_cpp.llama_init_from_model(self._model, self._plain_params)
            if not self._plain_ctx:
                raise HyflashError(f"llama.cpp could not create a second context for {self.name}")
        return self._plain_ctx

    def _meta(self, key: str) -> str:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else ""

    def _eos_ids(self) -> frozenset[int]:
        # llama.cpp stops at every end-of-generation token (eos, eot, <|im_end|>, ...); so does hyflash here.
        ids = {t for t in range(self.vocab_size) if llama_cpp.llama_vocab_is_eog(self._vocab, t)}
        value = getattr(self.tokenizer, "eos_token_id", None)
        if value is not None:
            ids.update(value if isinstance(value, (list, tuple)) else [value])
        return frozenset(int(i) for i in ids)

    def encode_rendered(self, text: str) -> list[int]:
        if isinstance(self.tokenizer, LlamaCppTokenizer):  # llama.cpp's own tokenizer (a bare .gguf)
            return self.tokenizer.encode_rendered(text)
        return super().encode_rendered(text)

    # ----- shape facts -----------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return torch.float32  # features and borrowed weights come back dequantised

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def precision(self) -> str:
        """The GGUF's quantisation as llama.cpp names it (its model description: "llama 256M Q4_1")."""
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buf, len(buf))
        parts = buf.value.decode(errors="replace").split(" ", 2)
        return parts[2] if len(parts) == 3 else "gguf"

    def load_sibling(self, name_or_path: str) -> "LlamaCppTarget":
        return LlamaCppTarget.load(name_or_path, record_features=False, n_threads=self.threads)

    def identity(self) -> dict:
        """What, besides the CPU, makes a cost curve of this target valid: llama.cpp's version and build (its
        matrix kernels), the file (a fingerprint, so a re-quantised file under the same name is measured
        afresh) and the settings that change a pass's cost (threads, flash attention, the eval callback, the
        KV cache's types, weights not repacked as the build would by default)."""
        ident = {"backend": self.backend, "llama_cpp": llama_cpp.__version__, "kernels": matmul_kernels(),
                 "gguf": file_fingerprint(self.path),
                 "threads": self.threads, "flash_attn": self.flash_attn, "eval_callback": self.record_features,
                 "cache_types": list(self.cache_types)}
        if self.repack != default_repack():  # only then: cost curves and feature caches keyed before stay valid
            ident["repack"] = self.repack
        if self.record_features and self.eval_gate:  # the callback costs less: curves timed without it are stale
            ident["eval_gate"] = "c"
        if two_by_two_kernels():  # multi-token passes cost less: curves timed on a stock build are stale
            ident["two_by_two"] = two_by_two_kernels()
        return ident

    def numbers_identity(self) -> dict:
        """The same model computes other numbers on llama.cpp: its build, file and settings (threads and the
        eval callback's gate aside: neither changes a number)."""
        return {k: v for k, v in self.identity().items() if k not in ("threads", "eval_gate")}

    # ----- frozen pieces drafters reuse (from the GGUF, dequantised once) --------------------------------
    def _weight(self, key: str) -> torch.Tensor:
        """The token embedding ("embed") or the LM head ("head") as float32 rows, dequantised once from the GGUF.
        A tied model shares one tensor: one without output.weight (SmolLM2, Gemma), and one whose output.weight is
        its embedding quantised again (Qwen2.5-Coder's file: Q6_K head, Q4_K embedding, 7% apart; `_stored_twice`),
        where a second copy would cost ~0.9 GB for nothing a drafter can measure (the head's quantisation moved
        chat-wild tau 1.81 -> 1.80, experiments/qwen/chat-wild-head-and-vocab/). An untied model's head is
        output.weight, whichever of the two is read first."""
        if key not in self._weights:
            import gguf
            from gguf.quants import dequantize

            reader = gguf.GGUFReader(str(self.path))
            tensors = {t.name: t for t in reader.tensors}
            head, embed = tensors.get("output.weight"), tensors.get("token_embd.weight")
            tied = head is None or (embed is not None and _stored_twice(head, embed))
            name = "output.weight" if key == "head" and not tied else "token_embd.weight"
            if name not in tensors:
                raise HyflashError(f"{self.path} has no {name} tensor: not a supported decoder-only GGUF")
            t = tensors[name]
            rows = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            # Made outside inference mode even when first asked inside it (a drafter's first draft): an
            # inference tensor has no version counter, which a drafter loaded later reads (its head cache).
            with torch.inference_mode(False):
                self._weights[key] = torch.from_numpy(rows.reshape(-1, self.hidden_size))
            if tied:  # both keys at once: a later read of the other finds it here
                self._weights["head" if key == "embed" else "embed"] = self._weights[key]
        return self._weights[key]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        # Gemma scales its embedding by sqrt(hidden) in the graph (transformers: a scaled embedding module).
        out = torch.nn.functional.embedding(torch.as_tensor(ids, dtype=torch.long), self._weight("embed"))
        return out * self._embed_scale if self._embed_scale != 1.0 else out

    def head_weight(self) -> torch.Tensor:
        return self._weight("head")

    # ----- the eval callback ------------------------------------------------------------------------------
    def _on_tensor(self, tensor: int, ask: bool, user_data) -> bool:
        """Asked once per graph node whether we want it; then called with each wanted node's data."""
        try:
            if not self._recording:
                return not ask  # nothing wanted: ask -> False, data -> continue
            j = self._tensor_of.get(self._ggml.ggml_get_name(tensor))
            if ask:
                return j is not None
            if j is not None:
                n = self._ggml.ggml_nelements(tensor)
                if self._ggml.ggml_nbytes(tensor) != 4 * n:
                    raise HyflashError("a feature tensor is not float32: this llama.cpp build is unsupported")
                out = np.empty(n, dtype=np.float32)
                self._ggml.ggml_backend_tensor_get(tensor, out.ctypes.data, 0, 4 * n)
                self._parts[j].append(out.reshape(-1, self.hidden_size))
        except BaseException as exc:  # an exception cannot cross the C boundary: re-raised after decode
            self._callback_error = exc
        return True

    # ----- cached forward passes ---------------------------------------------------------------------------
    @property
    def cache_length(self) -> int:
        return self._length

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, False)  # cells only: see _move_sequence
        self._length = self._junk = 0
        self._tree = None
        self._prefilled.pop(self._in_feature_ctx, None)

    @property
    def _in_feature_ctx(self) -> bool:
        return self._ctx is self._feature_ctx

    def _cut_prefilled(self, length: int) -> None:
        """The context in use keeps only its first `length` cells: so does its last prefill's record."""
        if self._in_feature_ctx in self._prefilled:
            self._prefilled[self._in_feature_ctx].cut(length)

    def kv_bytes(self) -> int:
        """The size of sequence 0's cache state as llama.cpp would save it: its cells' keys and values."""
        return int(llama_cpp.llama_state_seq_get_size(self._ctx, 0))

    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached tokens."""
        if self._tree is not None:
            raise RuntimeError("a scored draft tree is resolved by keep(), not rollback()")
        self._check_rollback(length)
        if length < self._length:
            if not llama_cpp.llama_memory_seq_rm(self._mem, 0, length, -1):
                raise HyflashError(f"llama.cpp cannot roll {self.name}'s cache back to {length} tokens")
            self._length = length
            self._cut_prefilled(length)

    @torch.inference_mode()
    def prefill(self, ids, features: bool = True, feature_free: bool = False, on_features=None,
                resumable=None) -> TargetOutput:
        """Start a new sequence: run the prompt BATCH tokens per llama_decode.

        Only the last position's logits ([1, V]), as in the transformers backend; features of every position,
        or each batch's handed to `on_features` (see BaseTarget.prefill).
        A feature_free sequence runs in the context without the eval callback (`_use_context`); asking it for
        features is refused by `_decode`.
        A prefill keeps the whole chunks its prompt shares with the context's last prefill (`prefill_reuse`;
        `reused_tokens` says how many tokens): the same prompt again costs nothing, a chat's next turn only
        its new chunks, and the logits are a fresh prefill's bit for bit. One that wants features keeps cells
        only where `resumable` (the drafter `on_features` feeds) can be restored to its state there: the kept
        chunks' features are not held (a drafter takes a prompt's features piece by piece so that they never
        all are), the drafter's snapshots at the last prompt's last whole chunk and end are."""
        features = features or on_features is not None
        self._use_context(feature_free)
        ids = [int(i) for i in torch.as_tensor(ids).view(-1).tolist()]
        self.check_prompt_length(len(ids))
        keep, record, logits = begin_prefill(
            self._prefilled.get(self._in_feature_ctx), ids, BATCH, features, on_features, resumable,
            self._keep_prompt_cells, self.reset, reusable=self._tree is None)
        self.reused_tokens, feats = keep, []
        for start in range(keep, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
            last = start + len(chunk) == len(ids)
            outputs = len(chunk) if features and self._all_outputs else int(last)
            logits, f = self._decode(chunk, outputs, features)
            if on_features is not None:
                on_features(torch.tensor(chunk, dtype=torch.long), f)
            else:
                feats.append(f)
            record.after_chunk(start + len(chunk), resumable)
        record.logits = logits[-1:].clone()
        self._prefilled[self._in_feature_ctx] = record
        return TargetOutput(logits=logits[-1:], features=torch.cat(feats) if features and feats else None)

    def _keep_prompt_cells(self, keep: int) -> None:
        """Drop every cell from `keep` on (the verified text's, a tree's leaves', the junk): the chunks a prefill
        runs next take cells keep.. in order, as in a fresh prefill."""
        llama_cpp.llama_memory_seq_rm(self._mem, -1, keep, -1)
        self._length, self._junk = keep, 0

    @torch.inference_mode()
    def score(self, ids, features: bool = True, tree=None) -> TargetOutput:
        """Run a block on top of the cache; logits [q, V] and features [q, nF, H] for every block position.
        With tree=(ancestor mask [q, q], depth offsets [q]) the block is a draft tree (see the module doc);
        keep() then keeps one root-to-node path."""
        ids = [int(i) for i in torch.as_tensor(ids).view(-1).tolist()]
        if self._length + len(ids) > self.max_context:
            raise HyflashError(f"sequence would exceed the model's context of {self.max_context} tokens")
        if len(ids) > BATCH:
            raise ValueError(f"score() takes at most {BATCH} tokens per block")
        if self._tree is not None:
            raise RuntimeError("keep() must resolve a scored draft tree before the next pass")
        layout = None if tree is None else _TreeBlock.of(self._length, *tree)
        self._make_room(len(ids))
        if layout is not None:
            for seq in layout.leaf_seqs:  # each leaf's path continues the verified text
                llama_cpp.llama_memory_seq_cp(self._mem, 0, seq, -1, -1)
        logits, feats = self._decode(ids, len(ids), features, layout)
        self._tree = layout
        return TargetOutput(logits=logits, features=feats)

    def keep(self, start: int, kept: list[int]) -> None:
        """After a chain block: a rollback. After a tree block its entries live in the leaves' sequences, not in
        the verified text's, so even a kept prefix of the block is relabelled (_keep_tree_path)."""
        if self._tree is None:
            return super().keep(start, kept)
        self._keep_tree_path(start, kept)

    def _keep_tree_path(self, start: int, kept: list[int]) -> None:
        """Sequence 0 gets the kept root-to-node path's cells, the junk sequence every other node's, and the
        leaves' sequences are emptied.

        Why not free the rejected cells: llama.cpp puts the next tokens into the lowest free cells, so they
        would sit between the kept cells, attention would sum over the context in another order, and the
        logits would stop being bit-identical to plain decoding's. Junk cells are masked (skipped) by every
        later pass; `_make_room` compacts the cache when they add up."""
        tree, self._tree = self._tree, None
        if start != tree.start or kept[0] != 0 or any(tree.positions[k] != start + j for j, k in enumerate(kept)):
            raise ValueError(f"keep({start}, {kept}) is not a root-to-node path of the scored tree")
        rejected = sorted(set(range(len(tree.positions))) - set(kept))
        for i in rejected:  # node i is the one cell of its first leaf's sequence at its position
            pos = tree.positions[i]
            llama_cpp.llama_memory_seq_cp(self._mem, tree.seqs[i][0], JUNK_SEQ, pos, pos + 1)
        # Any leaf through the last kept node holds the whole kept path at positions start .. start + len - 1.
        llama_cpp.llama_memory_seq_cp(self._mem, tree.seqs[kept[-1]][0], 0, start, start + len(kept))
        for seq in tree.leaf_seqs:
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._cut_prefilled(start)
        self._length = start + len(kept)
        self._junk += len(rejected)

    def _make_room(self, q: int) -> None:
        """Compact the cache (drop the junk cells) when they fill it or add up: save sequence 0's state, clear,
        restore; its cells come back contiguous and in order, so later passes stay exact."""
        if not self._junk or (self._junk < JUNK_LIMIT and self._length + self._junk + q <= self.max_context):
            return
        self._move_sequence(self._ctx)

    def drop_features(self) -> None:
        """No pass of this sequence will ask for features again (the drafter that read them retired): move it
        into the context without the eval callback, whose passes cost what plain decoding's do (0.3-1 ms less a
        step on SmolLM2 Q4_1). Its cache is copied there as `_make_room` compacts one, so later passes stay exact."""
        if self._ctx is self._feature_ctx and self._tree is None:
            start = time.perf_counter()
            size = self._move_sequence(self._plain_context())
            self._move_bytes_per_ms = size / max(1e-3, 1000 * (time.perf_counter() - start))

    def drop_features_ms(self) -> float:
        """What drop_features would take now: the sequence's bytes at the speed the last move ran (a long
        context's cache is ~100 MB, more than the callback costs over a hundred steps)."""
        return self.kv_bytes() / self._move_bytes_per_ms if self._ctx is self._feature_ctx else 0.0

    def _move_sequence(self, ctx) -> int:
        """Save sequence 0's cells, clear `ctx`'s cache and restore them there (contiguous, in order); `ctx`
        becomes the context in use (it may be the current one: then this compacts it). Returns the bytes moved."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, 0)
        moved = self._prefilled.get(self._in_feature_ctx)  # the bytes move as they are: what was reusable stays so
        self._ctx, self._mem = ctx, llama_cpp.llama_get_memory(ctx)
        self._prefilled.pop(self._in_feature_ctx, None)
        if moved is not None:
            self._prefilled[self._in_feature_ctx] = replace(moved, snapshots=dict(moved.snapshots))
        # Forget the cells, keep the buffers' bytes: zeroing them (data=True) writes the whole context's cache,
        # 14 ms for SmolLM2's 8,192 cells (Intel Xeon, 2 cores), 1.4 steps each time a retiring drafter moved
        # its sequence here. A cell no sequence holds is masked out of attention (flash attention skips it), as
        # rolled-back draft cells always were, so its stale bytes change no logit.
        llama_cpp.llama_memory_clear(self._mem, False)
        if not written or llama_cpp.llama_state_seq_set_data(self._ctx, buf, written, 0) == 0:
            raise HyflashError(f"llama.cpp could not move {self.name}'s cache")
        self._junk = 0
        return written

    def _decode(self, ids: list[int], outputs: int, features: bool,
                tree: _TreeBlock | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One llama_decode of `ids` at the cache's end (a chain in sequence 0, or a tree's layout); logits of
        the last `outputs` positions."""
        if features and self._ctx is not self._feature_ctx:
            raise HyflashError(f"{self.name}: this sequence was prefilled feature_free (or the target was "
                               "loaded with record_features=False), so it cannot give features")
        q, batch = len(ids), self._batch
        first_output = q - outputs
        for i, token in enumerate(ids):
            seqs = (0,) if tree is None else tree.seqs[i]
            batch.token[i] = token
            batch.pos[i] = self._length + i if tree is None else tree.positions[i]
            batch.n_seq_id[i] = len(seqs)
            for k, seq in enumerate(seqs):
                batch.seq_id[i][k] = seq
            batch.logits[i] = i >= first_output
        batch.n_tokens = q
        logits, feats = self._run(self._ctx, batch, ids, outputs, features,
                                  where=f"at {self._length} cached tokens")
        self._length += q
        return logits, feats

    def _run(self, ctx, batch, ids: list[int], outputs: int, features: bool,
             where: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """llama_decode of a filled `batch` in `ctx`: logits of its `outputs` flagged positions (in batch order)
        and, when recording, the feature rows of every token [q, nF, H] from the eval callback."""
        q = len(ids)
        self._parts = [[] for _ in self.feature_layers]
        self._callback_error = None
        self._recording = features
        if self._gate is not None:
            self._gate.recording = int(features)
        try:
            rc = llama_cpp.llama_decode(ctx, batch)
        finally:
            self._recording = False
            if self._gate is not None:
                self._gate.recording = 0
        if self._callback_error is not None:
            raise self._callback_error
        if rc != 0:
            raise HyflashError(f"llama.cpp decode failed (code {rc}) {where}")
        logits = torch.empty(0, self.vocab_size)
        if outputs:  # rows in batch order of the flagged positions
            ptr = llama_cpp.llama_get_logits(ctx)
            logits = torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(outputs, self.vocab_size)).copy())
        if not features:
            return logits, None
        layers = []
        for j, i in enumerate(self.feature_layers):
            if i == 0:
                layers.append(self.embed(torch.tensor(ids)))
                continue
            rows = np.concatenate(self._parts[j]) if self._parts[j] else np.empty((0, self.hidden_size), np.float32)
            if rows.shape[0] != q:
                raise HyflashError(
                    f"llama.cpp gave {rows.shape[0]} rows of feature layer {i} for {q} tokens: the "
                    f"{self.architecture} graph does not name its layer outputs `l_out-N` as expected")
            layers.append(torch.from_numpy(rows))
        return logits, torch.stack(layers, dim=1)

    def open_streams(self, slots: int, seq_context: int, features: bool) -> "SequenceStreams":
        """A llama.cpp context of its own on this model for `slots` independent sequences of up to
        `seq_context` tokens each (batched data generation); features from this target's eval callback."""
        return SequenceStreams(self, slots, seq_context, features)


def _stored_twice(head, embed, rows: int = 64) -> bool:
    """Whether a GGUF's output.weight is its token embedding quantised again (a tied model whose converter wrote
    both): `rows` rows spread over the vocabulary differ by under 25% of their norm (Qwen2.5-Coder-1.5B's Q6_K
    and Q4_K copies: 7%; two independent matrices: ~140%)."""
    from gguf.quants import dequantize

    if tuple(head.shape) != tuple(embed.shape):
        return False
    picks = np.linspace(0, head.data.shape[0] - 1, rows).astype(np.int64)
    a, b = (np.asarray(dequantize(t.data[picks], t.tensor_type), dtype=np.float32) for t in (head, embed))
    return bool(np.linalg.norm(a - b) < 0.25 * np.linalg.norm(a))


class SequenceStreams:
    """`slots` sequences in one llama_context, each in its own KV stream (kv_unified off): a sequence's cells
    start at 0 and stay in position order, as in the target's own single-sequence cache, and attention reads
    only its own stream. llama.cpp cuts a multi-stream batch into runs of consecutive sequence ids in
    increasing order, so with tokens in slot order the eval callback's feature rows are in batch order."""

    def __init__(self, target: LlamaCppTarget, slots: int, seq_context: int, features: bool):
        if features and not target.record_features:
            raise HyflashError("the llama.cpp target was loaded with record_features=False: it cannot give features")
        if slots > BATCH:
            raise HyflashError(f"--batch-size {slots} is more than llama.cpp's batch of {BATCH} tokens")
        self.target, self.slots, self.seq_context, self.features = target, slots, seq_context, features
        # The final norm's rows exist for output positions only: a recording prefill flags every position.
        self.all_outputs = features and target._all_outputs
        params = llama_cpp.llama_context_params.from_buffer_copy(target._plain_params)
        params.n_seq_max = slots
        params.kv_unified = False
        params.n_ctx = slots * seq_context
        if features:
            target._set_callback(params)
        self.ctx = llama_cpp.llama_init_from_model(target._model, params)
        if not self.ctx:
            raise HyflashError(f"llama.cpp could not create a context of {slots} x {seq_context} tokens "
                               f"for {target.name}: use a smaller --batch-size")
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(BATCH, 0, 1)

    def clear(self, slot: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.mem, slot, -1, -1)

    def decode(self, entries: list[tuple[int, int, int]], outputs: list[bool]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One llama_decode of (token, position, slot) entries: logits of the flagged ones [n_out, V] and, when
        recording, the feature rows of every entry [n, nF, H] (float32)."""
        batch = self.batch
        for i, ((token, pos, slot), out) in enumerate(zip(entries, outputs)):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, out
            batch.seq_id[i][0] = slot
        batch.n_tokens = len(entries)
        return self.target._run(self.ctx, batch, [e[0] for e in entries], sum(outputs), self.features,
                                where="in batched generation")

    def close(self) -> None:
        if self.ctx:
            llama_cpp.llama_batch_free(self.batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown may have torn the bindings down already
            pass
