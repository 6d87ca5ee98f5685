"""Training data written by the target itself: prompts in, target continuations out, as token-id shards.

A drafter must predict what *the target* will say, so the labels are the target's own outputs (greedy and
sampled), not corpus text. Layout of a data folder:

  manifest.json            settings, target, and one entry per finished shard (sequences, tokens, sha256)
  shard-00000.safetensors  tokens  uint16 (uint32 if the vocabulary needs it), all sequences concatenated
                           offsets int64 [n+1]   sequence i = tokens[offsets[i]:offsets[i+1]]
                           gen_start int32 [n]   first target-written position (before it: the prompt)
                           sampled uint8 [n]     1 if the continuation was sampled, 0 if greedy
                           prompt_index int32 [n]

Shard s always holds prompts [s*shard_prompts, (s+1)*shard_prompts) of the deterministic prompt list, so an
interrupted run resumes by skipping the shards the manifest lists. Files are written to a temporary name
and renamed (atomic), the manifest last: a kill leaves either a finished shard or none.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from hyflash.corpora import PROMPT_KINDS, Prompt, build_prompts
from hyflash.errors import HyflashError
from hyflash.files import atomic_write_bytes, atomic_write_json
from hyflash.targets import DTYPES, HFTarget, load_target
from hyflash.training.features import FeatureCache, FeatureRecorder
from hyflash.training.user_prompts import read_prompt_file
from hyflash.training.varied_prompts import build_varied

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


@dataclass
class DataConfig:
    model: str = "smollm2-135m"
    split: str = "train"
    num_prompts: int = 1024  # 0 = every prompt of the split
    seed: int = 0
    dtype: str = "bfloat16"
    max_new_tokens: int = 192
    long_new_tokens: int = 128  # continuation length after a long prefix
    max_prompt_tokens: int = 768  # short prompts keep their last tokens
    long_chars: int = 16000  # long prefixes: 1/2..1x this many characters (~2.3k-4.6k tokens); 0 = none
    long_every: int = 64  # at most one long prompt per this many prompts (they are slow to generate)
    sampled_fraction: float = 0.3  # the rest is greedy (what greedy speculative decoding sees)
    temperature: float = 0.8
    top_p: float = 0.95
    batch_size: int = 64  # decoding a batch is bandwidth-bound: bigger batches are cheaper per token
    long_batch_size: int = 4
    shard_prompts: int = 128
    source_root: str = ""  # a folder of .py files to draw prompts from; "" = this Python's standard library
    # Added after the first data folders; their defaults reproduce those folders' prompt lists exactly.
    per_module: int = 4  # short prompts per module (half that for test modules)
    long_per_module: int = 1  # long prompts per big module (each a different cut point)
    multiturn_every: int = 0  # every n-th further function of a module as a two-turn chat; 0 = none
    prose_per_package: int = 0  # docstring-continuation prompts per installed package; 0 = none
    kinds: str = ""  # comma list of prompt kinds to keep (e.g. "long" for a long-context folder); "" = all
    source: str = "stdlib"  # stdlib: the prompts above | varied: many tasks and phrasings (varied_prompts.py)
    prompts: str = ""  # a file of the user's own prompts (JSONL messages / conversations, or text lines)
    backend: str = "transformers"  # transformers | llama.cpp (the GGUF, several sequences per batch)

    def __post_init__(self) -> None:
        """Refuse nonsensical numbers up front (before any model loads), naming the command-line option."""
        def check(name: str, ok: bool, rule: str) -> None:
            if not ok:
                flag = "--" + name.replace("_", "-")
                raise HyflashError(f"{flag} must be {rule}, got {getattr(self, name)!r}")

        for name in ("num_prompts", "long_per_module", "multiturn_every", "prose_per_package", "long_every",
                     "long_chars"):
            check(name, getattr(self, name) >= 0, ">= 0" + (" (0 = every prompt)" if name == "num_prompts" else ""))
        for name in ("max_new_tokens", "long_new_tokens", "max_prompt_tokens", "batch_size",
                     "long_batch_size", "shard_prompts", "per_module"):
            check(name, getattr(self, name) >= 1, ">= 1")
        check("sampled_fraction", 0.0 <= self.sampled_fraction <= 1.0, "between 0 and 1")
        check("temperature", self.temperature >= 0.0, ">= 0")
        check("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]")
        check("source", self.source in ("stdlib", "varied"), "stdlib or varied")
        check("backend", self.backend in ("transformers", "llama.cpp"), "transformers or llama.cpp")
        check("source", not (self.prompts and self.source != "stdlib"), "left out with --prompts (the file is the source)")
        unknown = sorted(set(self.kind_list()) - set(PROMPT_KINDS))
        check("kinds", not unknown, f"a comma list of {', '.join(PROMPT_KINDS)} (unknown: {', '.join(unknown)})")

    def kind_list(self) -> list[str]:
        return [k.strip() for k in self.kinds.split(",") if k.strip()]


# Settings added after data folders were first written, with the values that reproduce those folders.
_ADDED_SETTINGS = {"per_module": 4, "long_per_module": 1, "multiturn_every": 0, "prose_per_package": 0, "kinds": "",
                   "source": "stdlib", "prompts": "", "backend": "transformers"}


def select_prompts(config: DataConfig) -> list[Prompt]:
    """The deterministic prompt list: long prompts thinned to one per `long_every`. A --prompts file is
    taken as it is, in file order (--split does not apply to it)."""
    root = Path(config.source_root) if config.source_root else None
    if config.prompts:
        prompts = read_prompt_file(config.prompts)
    elif config.source == "varied":
        prompts = build_varied(config.split, seed=config.seed, per_file=config.per_module, root=root,
                               long_chars=config.long_chars, long_per_module=config.long_per_module,
                               prose_per_package=config.prose_per_package)
    else:
        prompts = build_prompts(
            config.split, seed=config.seed, per_module=config.per_module, long_chars=config.long_chars, root=root,
            long_per_module=config.long_per_module, multiturn_every=config.multiturn_every,
            prose_per_package=config.prose_per_package,
        )
    keep = set(config.kind_list()) or set(PROMPT_KINDS)
    out, since_long = [], config.long_every
    for p in prompts:
        if p.kind not in keep:
            continue
        if p.kind == "long":
            if since_long < config.long_every:
                continue
            since_long = 0
        since_long += 1
        out.append(p)
    return out[: config.num_prompts] if config.num_prompts else out


def encode(target, prompt: Prompt, config: DataConfig) -> list[int]:
    if prompt.chat:
        ids = target.encode_prompt(prompt.text, chat=True, history=prompt.history, system=prompt.system)
    else:
        ids = [int(i) for i in target.tokenizer(prompt.text)["input_ids"]]
    if prompt.kind != "long" and len(ids) > config.max_prompt_tokens:
        ids = ids[-config.max_prompt_tokens :]
    return ids


@torch.inference_mode()
def generate_batch(
    target, prompts: list[list[int]], max_new_tokens: int, sampled: bool, config: DataConfig, seed: int,
    with_features: bool = False,
) -> tuple[list[list[int]], list[torch.Tensor] | None]:
    """Continuations for a batch of prompts (left padding), cut after the first end-of-sequence token, and
    optionally the target's features of every prompt + continuation position ([len, nF, H]; the last
    token is never run through the target, so its row is zero; no training block reads it)."""
    from contextlib import nullcontext

    model, tok = target.model, target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(target.eos_token_ids, default=0)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(target.device), mask.to(target.device)
    torch.manual_seed(seed)  # sampled batches are reproducible given the seed (per device)
    extra = dict(temperature=config.temperature, top_p=config.top_p, top_k=0) if sampled else {}
    recorder = FeatureRecorder(target) if with_features else None
    with recorder or nullcontext():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=sampled,
            pad_token_id=pad,
            eos_token_id=sorted(target.eos_token_ids) or None,
            **extra,
        )
    results = []
    for row in out[:, width:].tolist():
        for j, t in enumerate(row):
            if t in target.eos_token_ids:
                row = row[: j + 1]
                break
        results.append(row)
    if recorder is None:
        return results, None
    feats = recorder.features()  # [B, width + steps - 1, nF, H]
    per_row = []
    for i, (p, r) in enumerate(zip(prompts, results)):
        n = len(p) + len(r)
        f = feats[i, width - len(p) : width - len(p) + n - 1]
        per_row.append(torch.cat([f, f.new_zeros(1, *f.shape[1:])]).cpu())  # cat copies: rows own their memory
    return results, per_row


def _batches(items: list[int], size: int) -> list[list[int]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def make_shard(
    target, prompts: list[Prompt], first_index: int, config: DataConfig, with_features: bool = False, maker=None,
) -> tuple[dict[str, np.ndarray], list[torch.Tensor] | None]:
    """Generate one shard: prompts grouped by (long, sampled) and sorted by length to limit padding (on
    llama.cpp: `maker`, a LlamaCppShardMaker, runs them all through continuous batching)."""
    rng = np.random.default_rng([config.seed, first_index])
    sampled = rng.random(len(prompts)) < config.sampled_fraction
    encoded = [encode(target, p, config) for p in prompts]
    if maker is not None:
        requests = maker.run(encoded, [p.kind == "long" for p in prompts], list(sampled), first_index)
        continuation = [r.tokens for r in requests]
        features = [r.feature_rows[0] for r in requests] if with_features else None
        return shard_arrays(encoded, continuation, sampled, first_index, target.vocab_size), features
    continuation: list[list[int] | None] = [None] * len(prompts)
    features: list[torch.Tensor | None] = [None] * len(prompts)
    for is_long in (False, True):
        for is_sampled in (False, True):
            group = [i for i, p in enumerate(prompts) if (p.kind == "long") == is_long and sampled[i] == is_sampled]
            group.sort(key=lambda i: len(encoded[i]))
            size = config.long_batch_size if is_long else config.batch_size
            new = config.long_new_tokens if is_long else config.max_new_tokens
            for batch in _batches(group, size):
                seed = config.seed * 1_000_003 + first_index + batch[0]
                outs, feats = generate_batch(
                    target, [encoded[i] for i in batch], new, bool(is_sampled), config, seed, with_features
                )
                for j, (i, o) in enumerate(zip(batch, outs)):
                    continuation[i] = o
                    if feats is not None:
                        features[i] = feats[j]
    return (shard_arrays(encoded, continuation, sampled, first_index, target.vocab_size),
            features if with_features else None)


def shard_arrays(encoded: list[list[int]], continuation: list[list[int]], sampled: np.ndarray, first_index: int,
                 vocab_size: int) -> dict[str, np.ndarray]:
    """The arrays of one shard (see the module doc)."""
    seqs = [e + c for e, c in zip(encoded, continuation)]
    token_dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
    return {
        "tokens": np.concatenate([np.asarray(s, dtype=token_dtype) for s in seqs]),
        "offsets": np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64),
        "gen_start": np.asarray([len(e) for e in encoded], dtype=np.int32),
        "sampled": np.asarray(sampled).astype(np.uint8),
        "prompt_index": np.arange(first_index, first_index + len(encoded), dtype=np.int32),
    }


def _config_fingerprint(config: DataConfig) -> dict:
    """Settings that change the data (batch sizes too: padding changes bf16 rounding). num_prompts is left
    out: the prompt list is fixed, so a larger num_prompts extends a folder with more shards."""
    out = asdict(config)
    out.pop("num_prompts")
    return out


def _same_settings(stored: dict, config: DataConfig) -> bool:
    """A folder's settings match: settings it predates must be at the values that reproduce it."""
    wanted = _config_fingerprint(config)
    older = {k: v for k, v in _ADDED_SETTINGS.items() if k not in stored}
    return all(wanted.pop(k) == v for k, v in older.items()) and stored == wanted


def build_dataset(
    config: DataConfig, out: Path, target=None, progress: bool = True, feature_cache: str | Path = "",
    feature_dtype: str = "",
) -> dict:
    """Create or resume a data folder. Returns the manifest.

    feature_cache: also store the target's features of every sequence there (recorded during generation,
    at no extra target passes) for `hyflash train --feature-cache` to read instead of recomputing.
    feature_dtype: file them for a training run in this dtype instead of the generating one (see FeatureCache)."""
    from safetensors.numpy import save

    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    if manifest_path.exists():
        manifest = read_manifest(out)
        if not _same_settings(manifest["config"], config):
            raise HyflashError(
                f"{out} holds data made with other settings ({manifest['config']}); "
                "use another --out folder or the same settings to resume"
            )
    else:
        manifest = {"version": FORMAT_VERSION, "config": _config_fingerprint(config), "shards": [], "complete": False}
    prompts = select_prompts(config)
    if config.prompts:  # the settings name the file; its checksum tells whether it is the same file
        digest = hashlib.sha256(Path(config.prompts).expanduser().read_bytes()).hexdigest()
        if manifest.setdefault("prompts_sha256", digest) != digest:
            raise HyflashError(f"{config.prompts} changed since {out} was started: use another --out folder")
    if target is None:
        target = load_data_target(config, with_features=bool(feature_cache))
    manifest["target"] = {"name": config.model, **target.signature()}
    n_shards = (len(prompts) + config.shard_prompts - 1) // config.shard_prompts

    def wanted(s: int) -> int:
        return len(prompts[s * config.shard_prompts : (s + 1) * config.shard_prompts])

    # A shard is done if it holds all the prompts it should (the last one grows when num_prompts does).
    cache = None
    if feature_cache:
        # A llama.cpp target computes in float32: its features are filed in --feature-dtype, else --dtype.
        dtype = feature_dtype or ("" if config.backend == "transformers" else config.dtype)
        cache = FeatureCache(Path(feature_cache), target, DTYPES[dtype] if dtype else None)
    done = {s["index"] for s in manifest["shards"]
            if s["index"] < n_shards and s["sequences"] == wanted(s["index"]) and shard_intact(out, s)}
    manifest["shards"] = [s for s in manifest["shards"] if s["index"] in done]
    maker = None
    if config.backend == "llama.cpp":
        from hyflash.training.llamacpp_data import LlamaCppShardMaker

        maker = LlamaCppShardMaker(target, config, cache is not None, cache.dtype if cache else torch.float32)
        pending = [p for s in range(n_shards) if s not in done
                   for p in prompts[s * config.shard_prompts : (s + 1) * config.shard_prompts]]
        if pending:  # also without a progress bar: a log should say how long the run will take
            print(measure_speed(maker, target, pending, config), flush=True)

    from tqdm import tqdm

    bar = tqdm(total=len(prompts), unit="prompt", desc=f"data {config.split}", disable=not progress)
    resumed = done_prompts = sum(x["sequences"] for x in manifest["shards"])
    bar.update(resumed)
    start, written = time.perf_counter(), 0
    for s in range(n_shards):
        if s in done:
            continue
        chunk = prompts[s * config.shard_prompts : (s + 1) * config.shard_prompts]
        arrays, feats = make_shard(target, chunk, s * config.shard_prompts, config, cache is not None, maker)
        data = save(arrays)
        if cache is not None:  # before the manifest names the shard: a listed shard has its features
            sha = hashlib.sha256(data).hexdigest()
            for i, f in enumerate(feats):
                cache.put(f"{sha[:20]}-{i:05d}", f)
        name = f"shard-{s:05d}.safetensors"
        atomic_write_bytes(out / name, data)
        generated = int(arrays["offsets"][-1] - arrays["gen_start"].sum())
        manifest["shards"] = [x for x in manifest["shards"] if x["index"] != s]
        manifest["shards"].append(
            {
                "index": s,
                "file": name,
                "sequences": len(chunk),
                "tokens": int(arrays["offsets"][-1]),
                "generated": generated,
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
        manifest["shards"].sort(key=lambda x: x["index"])
        manifest["complete"] = len(manifest["shards"]) == n_shards
        atomic_write_json(manifest_path, manifest)
        written += generated
        bar.update(len(chunk))
        done_prompts += len(chunk)
        elapsed = time.perf_counter() - start
        bar.set_postfix(gen_tok_s=f"{written / elapsed:.0f}")
        if not progress:  # a log has no bar: say the pace each shard measured, and what it means for the rest
            print(shard_pace_line(s, n_shards, done_prompts, len(prompts), done_prompts - resumed, elapsed),
                  flush=True)
    bar.close()
    if maker is not None:
        maker.close()
    manifest["complete"] = True
    atomic_write_json(manifest_path, manifest)
    return manifest


def load_data_target(config: DataConfig, with_features: bool):
    """The target that writes the data: transformers in --dtype (on a GPU when there is one), or the GGUF on
    llama.cpp (with the eval callback only when features are recorded)."""
    if config.backend == "llama.cpp":
        return load_target(config.model, "auto", "llama.cpp", record_features=with_features)
    target = HFTarget.load(config.model, dtype=config.dtype)
    if torch.cuda.is_available():  # as `hyflash train`: a GPU generates when there is one
        target.model.to("cuda")
    return target


def shard_intact(folder: Path, shard: dict) -> bool:
    """Whether a listed shard's file is there and matches its checksum (else it is generated again)."""
    path = Path(folder) / shard["file"]
    if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == shard["sha256"]:
        return True
    print(f"{path} is {'corrupt' if path.exists() else 'missing'}: generating it again", flush=True)
    return False


def duration_text(seconds: float) -> str:
    """1h09m from an hour up, 31m05s below it: the one format of `hyflash data`'s ETA and pace lines."""
    minutes = int(seconds) // 60
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{int(seconds) % 60:02d}s"


def shard_pace_line(shard: int, n_shards: int, done: int, total: int, done_this_run: int, seconds: float) -> str:
    """After a shard: where the run is, and the time the rest takes at the pace this run has measured (nothing
    about the rest once every prompt is written)."""
    line = f"shard {shard + 1} of {n_shards} written ({done:,} of {total:,} prompts, {duration_text(seconds)} this run)"
    if done >= total:
        return line
    rest = seconds / max(done_this_run, 1) * (total - done)
    return f"{line}; the rest takes ~{duration_text(rest)} at this pace"


def measure_speed(maker, target, prompts: list[Prompt], config: DataConfig, warmup_tokens: int = 16) -> str:
    """Generate a few prompts briefly (results dropped) and return the speed and ETA line for `prompts`."""
    from hyflash.training.llamacpp_data import GenerationStats, speed_line

    encoded = [encode(target, p, config) for p in prompts]
    long = [p.kind == "long" for p in prompts]
    first = [i for i, lg in enumerate(long) if not lg][: config.batch_size] or [0]
    maker.run([encoded[i] for i in first], [long[i] for i in first], [False] * len(first), 0,
              new_tokens=(warmup_tokens, warmup_tokens))
    stats, maker.stats = maker.stats, GenerationStats()
    new = sum(config.long_new_tokens if lg else config.max_new_tokens for lg in long)
    return speed_line(stats, config.batch_size, sum(map(len, encoded)), new, len(prompts))


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.exists():
        raise HyflashError(f"{folder} is not a hyflash data folder (no {MANIFEST}); build one with `hyflash data`")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise HyflashError(f"{path} is corrupt ({exc}); delete the folder and rebuild it") from exc
    if manifest.get("version") != FORMAT_VERSION:
        raise HyflashError(f"{path} has format version {manifest.get('version')}, expected {FORMAT_VERSION}")
    return manifest


class TokenDataset:
    """All finished shards of one or more data folders, in memory (token ids are small)."""

    def __init__(self, folders: list[Path] | Path, verify: bool = True):
        from safetensors.numpy import load

        folders = [folders] if isinstance(folders, (str, Path)) else list(folders)
        self.sequences: list[np.ndarray] = []
        self.gen_start: list[int] = []
        self.sampled: list[int] = []
        self.keys: list[str] = []  # "<shard sha256 prefix>-<index in shard>": names the feature-cache file
        self.shard_digests: list[str] = []
        self.target: dict | None = None
        for folder in map(Path, folders):
            manifest = read_manifest(folder)
            if self.target is not None and manifest["target"] != self.target:
                raise HyflashError(f"{folder} was written by another target than {folders[0]}")
            self.target = manifest["target"]
            for shard in manifest["shards"]:
                data = (folder / shard["file"]).read_bytes()
                if verify and hashlib.sha256(data).hexdigest() != shard["sha256"]:
                    raise HyflashError(f"{folder / shard['file']} does not match its checksum: rebuild the shard")
                arrays = load(data)
                self.shard_digests.append(shard["sha256"][:20])
                offsets = arrays["offsets"]
                tokens = arrays["tokens"].astype(np.int64)
                for i in range(len(offsets) - 1):
                    self.sequences.append(tokens[offsets[i] : offsets[i + 1]])
                    self.keys.append(f"{shard['sha256'][:20]}-{i:05d}")
                self.gen_start.extend(int(g) for g in arrays["gen_start"])
                self.sampled.extend(int(s) for s in arrays["sampled"])
        if not self.sequences:
            raise HyflashError(f"no finished shards in {', '.join(map(str, folders))}")

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.sequences[i], self.gen_start[i]

    def token_counts(self, vocab_size: int, prompt_weight: float = 0.25) -> np.ndarray:
        """Token frequencies for choosing a reduced draft vocabulary: target-written tokens count fully,
        prompt tokens with `prompt_weight` (they rank the long tail a small data set never generated)."""
        counts = np.zeros(vocab_size, dtype=np.float64)
        for seq, g in zip(self.sequences, self.gen_start):
            counts += np.bincount(seq[g:], minlength=vocab_size)[:vocab_size]
            counts += prompt_weight * np.bincount(seq[:g], minlength=vocab_size)[:vocab_size]
        return counts

    def stats(self) -> dict:
        lengths = np.array([len(s) for s in self.sequences])
        generated = lengths - np.array(self.gen_start)
        return {
            "sequences": len(self),
            "tokens": int(lengths.sum()),
            "generated_tokens": int(generated.sum()),
            "max_length": int(lengths.max()),
            "long_sequences_2k": int((lengths >= 2048).sum()),
            "token_share_in_2k_sequences": round(float(lengths[lengths >= 2048].sum() / max(1, lengths.sum())), 4),
        }


def write_dataset(out: Path, sequences: list[list[int]], gen_starts: list[int], target_signature: dict,
                  name: str = "custom", shard_size: int = 256) -> dict:
    """Store already target-written sequences (e.g. from your own serving logs) as a data folder.

    gen_starts[i] is where the target-written part of sequence i begins; only that part is trained on.
    """
    from safetensors.numpy import save

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    token_dtype = np.uint16 if target_signature["vocab_size"] <= 1 << 16 else np.uint32
    manifest = {"version": FORMAT_VERSION, "config": {"source": name}, "shards": [], "complete": True,
                "target": {"name": name, **target_signature}}
    for s, first in enumerate(range(0, len(sequences), shard_size)):
        seqs = sequences[first : first + shard_size]
        arrays = {
            "tokens": np.concatenate([np.asarray(x, dtype=token_dtype) for x in seqs]),
            "offsets": np.cumsum([0] + [len(x) for x in seqs]).astype(np.int64),
            "gen_start": np.asarray(gen_starts[first : first + shard_size], dtype=np.int32),
            "sampled": np.zeros(len(seqs), dtype=np.uint8),
            "prompt_index": np.arange(first, first + len(seqs), dtype=np.int32),
        }
        data = save(arrays)
        file = f"shard-{s:05d}.safetensors"
        atomic_write_bytes(out / file, data)
        manifest["shards"].append({"index": s, "file": file, "sequences": len(seqs), "tokens": int(arrays["offsets"][-1]),
                                   "generated": int(sum(len(x) - g for x, g in zip(seqs, arrays["gen_start"]))),
                                   "sha256": hashlib.sha256(data).hexdigest()})
    atomic_write_json(out / MANIFEST, manifest)
    return manifest
