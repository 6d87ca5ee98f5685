"""Drafter training: random-anchor block training on target-written data, resumable, data-parallel.

One step: a global batch of sequences (the same for any number of processes; process r of N takes every
N-th), target features for them (on the fly or from the disk cache), many random anchors per sequence, one
drafter forward over all blocks, a position-weighted loss normalised by the *global* weight sum, AdamW with
warm-up + cosine, gradient clipping. Under `torchrun --nproc_per_node N` gradients are averaged by
DistributedDataParallel (gloo on CPU, nccl on CUDA); with the global normalisation N processes compute the
same update as one.

Output folder: log.jsonl (one JSON object per logged step / evaluation), checkpoints/step-*/ (resume),
drafter/ (the trained drafter, loadable with --drafter PATH), curves.png, train_config.json.
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from hyflash.corpora import build_prompts
from hyflash.drafters.config import DrafterConfig
from hyflash.drafters.copy import copy_labels
from hyflash.drafters.loading import TRAINED_SUBFOLDER
from hyflash.drafters.model import DrafterModel
from hyflash.errors import HyflashError
from hyflash.files import atomic_write_json, atomic_write_jsonl, read_jsonl
from hyflash.machine import bf16_matmul_pays
from hyflash.targets import HFTarget
from hyflash.training import checkpoint as ckpt
from hyflash.training import evaluate  # the module, not its names: tests replace evaluate.heldout_tau
from hyflash.training.batches import draft_vocab_from_counts, training_batches
from hyflash.training.config import TrainConfig
from hyflash.training.data import TokenDataset
from hyflash.training.features import FeatureCache, batch_features
from hyflash.training.losses import SlotWeights, expected_acceptance, slot_accuracy, slot_hits, weighted_ce, weighted_kl
from hyflash.training.onpolicy import onpolicy_loss
from hyflash.training.plots import plot_curves


class _StepModule(nn.Module):
    """forward = the training forward, so DistributedDataParallel sees (and syncs) it."""

    def __init__(self, drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, features, tokens, anchors, copy=None):
        hidden = self.drafter.train_forward(features, tokens, anchors, copy)
        return self.drafter.block_logits(hidden, None if copy is None else copy[0])


def lr_factor(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio at the last step."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _dist_info() -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0"))


def build_drafter(config: TrainConfig, target, dataset: TokenDataset):
    """A fresh drafter (or one loaded from --init) with its draft vocabulary picked from the training data."""
    if config.init:
        model = DrafterModel.from_pretrained(config.init, target, dtype=torch.float32)
        if config.copy_ngram and config.copy_ngram < model.config.copy_ngram:
            raise HyflashError(f"--copy-ngram {config.copy_ngram}: the --init drafter already has a copy input of "
                               f"{model.config.copy_ngram}, which can grow but not shrink; pass --copy-ngram "
                               f"{model.config.copy_ngram} or more")
        ngram = max(model.config.copy_ngram, config.copy_ngram)
        gate = model.config.copy_gate or config.copy_gate
        if gate and not ngram:
            raise HyflashError(f"--copy-gate: the --init drafter {config.init} has no copy input; add --copy-ngram N")
        if (ngram, gate) != (model.config.copy_ngram, model.config.copy_gate):
            model = with_copy_input(model, ngram, gate)
        return model.train()
    torch.manual_seed(config.seed)  # identical initial weights in every process
    model = DrafterModel(DrafterConfig.for_target(target, **config.drafter_overrides()), target)
    if config.init_from_target:  # deterministic copies: the same in every process
        notes = model.init_from_target()
        if _dist_info()[0] == 0:
            for note in notes:
                print(f"init from target: {note}", flush=True)
    if config.draft_vocab_size:
        counts = dataset.token_counts(target.vocab_size)
        ids = draft_vocab_from_counts(counts, config.draft_vocab_size, sorted(target.eos_token_ids))
        model.set_draft_vocab(torch.from_numpy(ids))
    return model.float().train()


def with_copy_input(model, copy_ngram: int, copy_gate: bool = False):
    """The same drafter with a copy input of `copy_ngram` (hyflash.drafters.copy), and its gate if asked, the new
    weights at zero, so that it drafts exactly as before until trained. A copy input that grows to longer
    matches gives each new match length the vector of the longest it had: the drafter then reads a longer
    match as it read the longest before (only the candidates change, to the occurrence with the longer match)."""
    config = DrafterConfig.from_dict({**model.config.to_dict(), "copy_ngram": copy_ngram, "copy_gate": copy_gate})
    grown = DrafterModel(config, model.target).to(model.norm.weight)
    state = model.state_dict()
    lengths = state.get("copy_length.weight")
    if lengths is not None and len(lengths) < copy_ngram + 1:
        state["copy_length.weight"] = torch.cat([lengths, lengths[-1:].expand(copy_ngram + 1 - len(lengths), -1)])
    missing, unexpected = grown.load_state_dict(state, strict=False)
    assert not unexpected and all(name.startswith("copy_") for name in missing), (missing, unexpected)
    return grown


def export_drafter(model, target, path: Path, dtype: str) -> Path:
    """Save the drafter (weights only, no target pieces) in `dtype`: bf16 halves the file."""
    copy = DrafterModel(model.config, target)
    copy.load_state_dict(model.state_dict())
    return copy.to(getattr(torch, dtype)).save_pretrained(path)


class JsonlLog:
    """Append-only JSONL; on resume, records after the restored step (written by the killed run) are dropped, and
    a last line cut short by the kill with them."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        if resume_step is None:
            atomic_write_jsonl(path, [])
        elif path.exists():
            atomic_write_jsonl(path, [r for r in read_jsonl(path) if r["step"] <= resume_step])

    def write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def make_optimizer(params: list[torch.Tensor], config: TrainConfig):
    """AdamW (weight decay on matrices only) and the warm-up + cosine schedule."""
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=(0.9, 0.95),
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config))


def feature_source(config: TrainConfig, target, dataset: TokenDataset):
    """The target whose features the drafter trains on, when it is not `target` itself (None): the llama.cpp
    target (--feature-backend llama.cpp), whose context fits the longest sequence, since features come from
    whole sequences; or the transformers target in --feature-compute-dtype."""
    if config.feature_backend != "llama.cpp":
        if config.feature_compute_dtype in ("", config.dtype):
            return None

        source = HFTarget.load(config.model, dtype=config.feature_compute_dtype)
        source.model.to(target.device)
        return source
    from hyflash.targets.llamacpp import LlamaCppTarget

    longest = max(len(s) for s in dataset.sequences)
    source = LlamaCppTarget.load(config.feature_gguf or config.model, feature_layers=target.feature_layers,
                                 n_ctx=longest + 1, n_threads=config.threads or None)
    if source.signature() != target.signature():
        raise HyflashError(f"{source.path} is not the model {config.model}: its shapes or feature layers differ "
                           f"({source.signature()} vs {target.signature()})")
    return source


def _restore(checkpoints: Path, resume: bool, model, optimizer, scheduler, fingerprint: dict,
             verbose: bool) -> tuple[int, dict]:
    """(the step to start from, the checkpoint's extra state): the newest checkpoint's with --resume; refuse
    to overwrite a run without it."""
    found = ckpt.list_checkpoints(checkpoints)
    if not resume:
        if found:
            raise HyflashError(f"{checkpoints.parent} already holds checkpoints: pass --resume to continue, "
                               "or use another --out")
        return 0, {}
    if not found:
        if verbose:
            print(f"no checkpoint in {checkpoints}: starting from scratch", flush=True)
        return 0, {}
    restored = ckpt.load_checkpoint(found[-1], model, optimizer, scheduler, fingerprint, TrainConfig().fingerprint())
    if verbose:
        print(f"resumed from {found[-1]} (step {restored.step})", flush=True)
    return restored.step, restored.meta.get("extra") or {}


def block_loss(config: TrainConfig, logits, labels, weights, target_logits):
    """(weighted loss sum, weight sum) of one batch of blocks: CE on the labels, or KL to the target's
    distribution at each slot (target_logits [b, A, S-1, Vd], from `batch_features`)."""
    if config.loss == "ce":
        return weighted_ce(logits, labels, weights)
    return weighted_kl(logits, target_logits.to(logits.device), labels, weights)


def onpolicy_generator(config: TrainConfig, step: int, rank: int, device: torch.device) -> torch.Generator:
    """The on-policy term's sampling generator for one step, on the device of the logits it samples."""
    return torch.Generator(device=device).manual_seed(config.seed * 1_000_003 + step * 64 + rank)


def train(config: TrainConfig, resume: bool = False, progress: bool = True, target=None) -> Path:
    """Run (or resume) a training run; returns the folder of the exported drafter."""
    rank, world, local_rank = _dist_info()
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # nccl collectives run on the current device: one per process
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    if config.threads:
        torch.set_num_threads(config.threads)
    if config.batch_size % world:
        raise HyflashError(f"--batch-size {config.batch_size} must be a multiple of the {world} processes")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)

    dataset = TokenDataset([Path(d) for d in config.data])
    if target is None:
        target = HFTarget.load(config.model, dtype=config.dtype)
    if torch.cuda.is_available():
        target.model.to(f"cuda:{local_rank}")
    if dataset.target and {k: dataset.target[k] for k in target.signature()} != target.signature():
        raise HyflashError(f"the data in {config.data[0]} was written by another target ({dataset.target['name']})")
    if config.autocast is None:  # decided before the fingerprint: a checkpoint records what the run did
        config = replace(config, autocast=bf16_matmul_pays(target.device))
        if rank == 0:
            print(f"bf16 autocast {'on' if config.autocast else 'off: bf16 is slower than float32 here'}", flush=True)
    model = build_drafter(config, target, dataset).to(target.device)
    if model.config.copy_ngram and (config.loss != "ce" or config.onpolicy_weight > 0):
        raise HyflashError("the --init drafter has a copy input: train it with --loss ce and no on-policy term")
    step_module = _StepModule(model)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        step_module = DistributedDataParallel(step_module, find_unused_parameters=True)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = make_optimizer(params, config)
    # The exact data too: a folder that grew since the checkpoint would change every later batch.
    fingerprint = {**config.fingerprint(), "data_shards": dataset.shard_digests}

    checkpoints = out / "checkpoints"
    start_step, extra = _restore(checkpoints, resume, model, optimizer, scheduler, fingerprint, verbose=rank == 0)
    slot_weights = SlotWeights(config.slot_weights, config.block_size, config.gamma)
    if slot_weights.adaptive and start_step:
        if "slot_acceptance" not in extra:
            raise HyflashError(f"the newest checkpoint in {checkpoints} has no slot_acceptance state for "
                               "--slot-weights survival; start a new --out folder")
        slot_weights.load_state(extra["slot_acceptance"])

    log = JsonlLog(out / "log.jsonl", start_step if resume else None) if rank == 0 else None
    if rank == 0:
        atomic_write_json(out / "train_config.json", {**asdict(config), "world_size": world,
                                                      "drafter": model.config.to_dict(),
                                                      "trainable_params": model.param_count(),
                                                      "data": dataset.stats()})
    source = feature_source(config, target, dataset)
    cache = None
    # Filed in the training dtype: a llama.cpp source's under its own key, another dtype's under the target's.
    if config.feature_cache:
        cache = FeatureCache(Path(config.feature_cache), source or target, None if source is None else target.dtype)
    batches = training_batches(dataset, config.steps, config.batch_size, config.anchors, config.block_size,
                               config.max_length, config.seed, start=start_step, rank=rank, world=world)
    eval_prompts = _heldout_prompts(target, config) if rank == 0 else []
    eval_steps = config.eval_steps()

    from tqdm import tqdm

    bar = tqdm(total=config.steps, initial=start_step, disable=not progress or rank != 0, desc="train", unit="step")
    timer, tokens_seen = time.perf_counter(), 0
    onpolicy = config.onpolicy()
    drafter_dir = out / TRAINED_SUBFOLDER
    for step, epoch, batch in batches:
        device = target.device
        features, target_logits = batch_features(target, batch, dataset, cache, want_logits=config.loss == "kl",
                                                 vocab_ids=model.draft_vocab_ids, source=source)
        # Ids outside the draft vocabulary become -1 (no loss: the drafter cannot propose them, whatever it learns).
        labels = model.draft_index(batch.labels).to(device)
        copy = model.copy_inputs(batch.tokens.to(device), batch.anchors.to(device))
        if model.config.has_pointer:  # a label outside the vocabulary that the copy candidate names: the pointer
            labels = copy_labels(labels, batch.labels.to(device), copy[0], len(model.draft_vocab_ids))

        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.autocast):
            logits = step_module(features.to(device), batch.tokens.to(device), batch.anchors.to(device), copy)
        weights = slot_weights.weights()  # survival: from the accuracy EMA of the steps before this one
        loss_sum, weight_sum = block_loss(config, logits, labels, weights, target_logits)
        # Normalise by the weight of the whole global batch; DDP then averages gradients over processes,
        # so multiply by the world size to get exactly the one-process gradient.
        totals = torch.stack([weight_sum.detach().float(), loss_sum.detach().float()])
        if slot_weights.adaptive:  # the global batch's hits and label counts per slot, in the same all-reduce
            totals = torch.cat([totals, *slot_hits(logits.detach(), labels)])
        if world > 1:
            dist.all_reduce(totals)
        if slot_weights.adaptive:
            slot_weights.update(*totals[2:].view(2, -1))  # for the next step (the loss above is built already)
        loss = loss_sum * world / totals[0].clamp_min(1e-9)
        onpolicy_stats = None
        if onpolicy is not None:
            # Per-process normalisation: with N processes the term is the mean over processes (DDP averages).
            term, onpolicy_stats = onpolicy_loss(
                logits, labels >= 0, batch.tokens, batch.anchors, model.to_target_ids, target, step, onpolicy,
                onpolicy_generator(config, step, rank, logits.device),
            )
            loss = loss + onpolicy.weight * term
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        for p in params:  # parameters a step did not reach get a zero gradient in every mode (as DDP gives)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip) if config.grad_clip > 0 else None
        optimizer.step()
        scheduler.step()
        done = step + 1
        tokens_seen += int(batch.lengths.sum())

        if rank == 0:
            global_loss = float(totals[1] / totals[0].clamp_min(1e-9))
            record = None
            if done % config.log_every == 0 or done == config.steps:
                acc = slot_accuracy(logits.detach(), labels)
                elapsed = time.perf_counter() - timer
                record = {
                    "step": done, "epoch": epoch, "loss": global_loss, "lr": scheduler.get_last_lr()[0],
                    "grad_norm": None if grad_norm is None else float(grad_norm),
                    "acc_by_slot": [round(a, 4) for a in acc],
                    "expected_tau": expected_acceptance(logits.detach(), labels),
                    "seconds_per_step": elapsed / max(1, config.log_every), "tokens_seen": tokens_seen,
                }
                if onpolicy_stats is not None:
                    record["onpolicy"] = onpolicy_stats
                if slot_weights.adaptive:
                    record["slot_weights"] = [round(w, 4) for w in weights.tolist()]
                timer = time.perf_counter()
                log.write(record)
            bar.set_postfix(loss=f"{global_loss:.3f}", **({"acc1": f"{record['acc_by_slot'][0]:.2f}"} if record else {}))
            bar.update(1)
        if done % config.save_every == 0 or done == config.steps:
            if rank == 0:
                extra = {"epoch": epoch}
                if slot_weights.adaptive:
                    extra["slot_acceptance"] = slot_weights.state()
                ckpt.save_checkpoint(checkpoints, done, model, optimizer, scheduler, fingerprint,
                                     extra=extra, keep=config.keep_checkpoints)
            if world > 1:
                dist.barrier()
        if rank == 0 and done == config.steps:  # before the final evaluation: a run that dies in it keeps it
            export_drafter(model, target, drafter_dir, config.save_dtype)
        want_eval = (config.eval_every and done % config.eval_every == 0) or done in eval_steps
        if rank == 0 and (want_eval or done == config.steps) and eval_prompts:
            result = evaluate.heldout_tau(model, target, eval_prompts, config.eval_new_tokens)
            log.write({"step": done, "eval": result})
            bar.set_postfix(loss=f"{global_loss:.3f}", tau=f"{result['tau']:.2f}")
            model.train()
        if world > 1 and want_eval:
            dist.barrier()
    bar.close()

    if rank == 0:
        if start_step >= config.steps:  # resumed from the last checkpoint: the loop had no step to export at
            export_drafter(model, target, drafter_dir, config.save_dtype)
        if config.plot:
            plot_curves(out / "log.jsonl", out / "curves.png")
        print(f"drafter saved to {drafter_dir}", flush=True)
    if world > 1:
        # Free the DDP wrapper while the process group is still registered: dropped later (when this frame
        # returns), its Reducer holds the last reference to the gloo group, whose destructor then joins gloo's
        # worker thread with the GIL held while that thread needs the GIL to free a finished barrier's work,
        # a deadlock (seen under load: one process finished, the other hung after training).
        del step_module
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    return drafter_dir


def _heldout_prompts(target, config: TrainConfig) -> list[list[int]]:
    """Chat prompts from held-out standard-library modules (never HumanEval), for tau during training."""
    if config.eval_prompts <= 0 or target.tokenizer is None:
        return []

    prompts = [p for p in build_prompts("heldout", seed=config.eval_seed, long_chars=0) if p.kind == "complete"]
    return [target.encode_prompt(p.text, chat=True) for p in prompts[: config.eval_prompts]]
