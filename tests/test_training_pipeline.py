"""Training pieces in-process, on tiny random targets: prompts, data folders, anchors/labels, losses,
checkpoints (round trip, corrupt, mismatched), the feature cache and one short training run."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from hyflash.errors import HyflashError
from hyflash.training import checkpoint as ckpt
from hyflash.training.batches import draft_vocab_from_counts, epoch_order, make_batch, sample_anchors
from hyflash.training.config import TrainConfig
from hyflash.training.data import TokenDataset, write_dataset
from hyflash.training.losses import SlotWeights, position_weights, slot_hits, weighted_ce, weighted_kl
from hyflash.corpora import build_prompts, split_of

MODULE_SOURCE = '''
import os


def add(a, b):
    """Add two numbers and return the sum."""
    total = a + b
    return total


def scale(values, factor):
    out = []
    for v in values:
        out.append(v * factor)
    return out


class Box:
    def area(self, w, h):
        """Area of a w x h box."""
        result = w * h
        return result
'''


@pytest.fixture()
def fake_stdlib(tmp_path):
    root = tmp_path / "lib"
    for i in range(12):
        (root / f"pkg{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"pkg{i % 3}" / f"mod{i}.py").write_text(MODULE_SOURCE.replace("add", f"add{i}"))
    (root / "broken.py").write_text("def oops(:\n")  # unparsable files are skipped, not fatal
    return root


def test_prompts_split_by_module_and_deterministic(fake_stdlib):
    train = build_prompts("train", root=fake_stdlib, heldout_percent=40)
    held = build_prompts("heldout", root=fake_stdlib, heldout_percent=40)
    assert train and held
    assert not {p.module for p in train} & {p.module for p in held}
    assert all(split_of(p.module, 40) == "train" for p in train)
    assert build_prompts("train", root=fake_stdlib, heldout_percent=40) == train
    assert {p.kind for p in train} <= {"code", "complete", "explain", "write", "long"}
    assert all("HumanEval" not in p.text for p in train)
    with pytest.raises(HyflashError):
        build_prompts("test", root=fake_stdlib)


def test_data_kinds_filter_keeps_only_the_named_kinds(fake_stdlib):
    from hyflash.training.data import DataConfig, select_prompts

    every = select_prompts(DataConfig(num_prompts=0, source_root=str(fake_stdlib), long_chars=300, long_every=0))
    only = select_prompts(DataConfig(num_prompts=0, source_root=str(fake_stdlib), long_chars=300, long_every=0,
                                     kinds="long, write"))
    assert {p.kind for p in every} > {"long", "write"}
    assert only == [p for p in every if p.kind in ("long", "write")] and only
    with pytest.raises(HyflashError, match="--kinds .*unknown: poem"):
        DataConfig(kinds="long,poem")


def _tiny_data(target, folder: Path, n: int = 12, prompt: int = 8, new: int = 24, seed: int = 0) -> TokenDataset:
    prompts = torch.randint(0, target.vocab_size, (n, prompt), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out = target.model.generate(input_ids=prompts, max_new_tokens=new, do_sample=False, pad_token_id=0)
    write_dataset(folder, [r.tolist() for r in out], [prompt] * n, target.signature(), name="tiny")
    return TokenDataset(folder)


def test_data_folder_round_trip_and_checksum(llama_target, tmp_path):
    data = _tiny_data(llama_target, tmp_path / "d")
    assert len(data) == 12 and data.stats()["generated_tokens"] == 12 * 24
    assert data[0][1] == 8 and len(data.keys) == 12
    shard = tmp_path / "d" / "shard-00000.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(HyflashError, match="checksum"):
        TokenDataset(tmp_path / "d")
    with pytest.raises(HyflashError, match="not a hyflash data folder"):
        TokenDataset(tmp_path / "nothing")
    long = tmp_path / "long"
    write_dataset(long, [[1] * 2048, [2] * 100, [3] * 2047], [10, 10, 10], llama_target.signature())
    stats = TokenDataset(long).stats()
    assert stats["long_sequences_2k"] == 1 and stats["token_share_in_2k_sequences"] == round(2048 / 4195, 4)


def test_anchors_only_on_target_written_blocks():
    for seed in range(20):
        length, gen_start = random.Random(seed).randint(12, 40), random.Random(seed + 1).randint(1, 10)
        anchors, valid = sample_anchors(length, gen_start, 8, 4, seed, 0, 3)
        assert (anchors[valid] >= gen_start).all() and (anchors <= length - 2).all()
        again = sample_anchors(length, gen_start, 8, 4, seed, 0, 3)
        assert (again[0] == anchors).all()


class _Seqs:
    def __init__(self, seqs, starts):
        self.seqs, self.starts = seqs, starts

    def __getitem__(self, i):
        return np.asarray(self.seqs[i]), self.starts[i]


def test_batch_labels_are_the_next_tokens_and_masked_past_the_end():
    seqs = [list(range(100, 130)), list(range(200, 212))]
    batch = make_batch(_Seqs(seqs, [5, 3]), [0, 1], num_anchors=6, block_size=4, max_length=64, seed=0, epoch=0)
    for b, seq in enumerate(seqs):
        for a, lab in zip(batch.anchors[b].tolist(), batch.labels[b].tolist()):
            for k, label in enumerate(lab, start=1):
                assert label == (seq[a + k] if a + k < len(seq) else -1)
    # Cropping keeps the last max_length tokens and shifts gen_start with them.
    cropped = make_batch(_Seqs(seqs, [5, 3]), [0], num_anchors=4, block_size=4, max_length=16, seed=0, epoch=0)
    assert cropped.offsets == [14] and cropped.tokens[0, 0].item() == 114


def test_draft_vocabulary_mapping(llama_target):
    from hyflash.drafters.config import DrafterConfig
    from hyflash.drafters.model import DrafterModel

    counts = np.array([5, 0, 9, 9, 1, 0])
    ids = draft_vocab_from_counts(counts, 3, always=[5])
    assert ids.tolist() == [5, 2, 3]
    model = DrafterModel(DrafterConfig.for_target(llama_target, draft_vocab_size=3), llama_target)
    model.set_draft_vocab(torch.from_numpy(ids))
    labels = torch.tensor([[2, 0, 5, -1]])
    assert model.draft_index(labels).tolist() == [[1, -1, 0, -1]]


def test_epoch_order_covers_each_sequence_once_in_similar_length_batches():
    lengths = np.arange(64)
    order = epoch_order(64, lengths, 4, seed=0, epoch=1)
    assert sorted(order.ravel().tolist()) == list(range(64))
    assert (epoch_order(64, lengths, 4, seed=0, epoch=1) == order).all()
    assert not (epoch_order(64, lengths, 4, seed=0, epoch=2) == order).all()


def test_losses():
    w = position_weights(5, 2.0)
    assert w.tolist() == pytest.approx([1.0, np.exp(-0.5), np.exp(-1.0), np.exp(-1.5)])
    logits = torch.randn(2, 3, 4, 7)
    labels = torch.randint(0, 7, (2, 3, 4))
    labels[0, 0, 2] = -1
    s, n = weighted_ce(logits, labels, w)
    manual = sum(
        -torch.log_softmax(logits[i, j, k], -1)[labels[i, j, k]] * w[k]
        for i in range(2) for j in range(3) for k in range(4) if labels[i, j, k] >= 0
    )
    assert s.item() == pytest.approx(manual.item(), rel=1e-5)
    assert n.item() == pytest.approx((w.sum() * 6 - w[2]).item(), rel=1e-6)
    kl, _ = weighted_kl(logits, logits.clone(), labels, w)
    assert abs(kl.item()) < 1e-5


def test_slot_weights_exp_and_survival():
    exp = SlotWeights("exp", 5, 2.0)
    assert torch.equal(exp.weights(), position_weights(5, 2.0))  # the old weights, bit for bit
    exp.update(torch.tensor([3.0, 0, 0, 0]), torch.tensor([4.0, 4, 4, 4]))
    assert torch.equal(exp.weights(), position_weights(5, 2.0))  # and they never move

    survival = SlotWeights("survival", 5, 2.0)
    # The EMA starts at exp(-1/gamma) per slot: the first weights have the exp weights' shape.
    torch.testing.assert_close(survival.weights(), position_weights(5, 2.0))
    survival.load_state([0.5, 0.4, 0.05, 0.9])
    assert survival.weights().tolist() == pytest.approx([1.0, 0.5, 0.5 * 0.4, 0.02])  # 0.01 floored at 0.02
    # A step: slot accuracies 3/4, 1/4, none seen (keeps its estimate), 0/2; EMA decay 0.9.
    survival.update(torch.tensor([3.0, 1, 0, 0]), torch.tensor([4.0, 4, 0, 2]))
    ema = [0.9 * 0.5 + 0.1 * 0.75, 0.9 * 0.4 + 0.1 * 0.25, 0.05, 0.9 * 0.9]
    assert survival.state() == pytest.approx(ema)
    assert survival.weights().tolist() == pytest.approx([1.0, ema[0], ema[0] * ema[1], max(0.02, ema[0] * ema[1] * ema[2])])

    logits = torch.tensor([[[[2.0, 0, 0], [0, 2.0, 0]], [[0, 0, 2.0], [2.0, 0, 0]]]])  # [1, 2 blocks, 2 slots, 3]
    hits, counts = slot_hits(logits, torch.tensor([[[0, 2], [2, -1]]]))
    assert hits.tolist() == [2.0, 0.0] and counts.tolist() == [2.0, 1.0]
    with pytest.raises(HyflashError, match="slot_weights"):
        TrainConfig(slot_weights="linear")
    with pytest.raises(HyflashError, match="exclude each other"):
        TrainConfig(init="runs/x/drafter", init_from_target=True)
    with pytest.raises(HyflashError, match="use --loss ce with --feature-backend llama.cpp"):
        TrainConfig(feature_backend="llama.cpp", loss="kl")
    with pytest.raises(HyflashError, match="feature_backend must be"):
        TrainConfig(feature_backend="onnx")
    with pytest.raises(HyflashError, match="add --feature-backend llama.cpp"):
        TrainConfig(feature_gguf="model.gguf")


def test_new_settings_are_train_flags():
    import argparse

    from hyflash.flags import dataclass_from_flags
    from hyflash.training.cli import add_cli

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers())
    args = parser.parse_args(["train", "--data", "d", "--init-from-target", "--slot-weights", "survival"])
    config = dataclass_from_flags(TrainConfig, args, data=args.data)
    assert config.init_from_target and config.slot_weights == "survival"
    plain = dataclass_from_flags(TrainConfig, parser.parse_args(["train", "--data", "d"]), data=["d"])
    assert not plain.init_from_target and plain.slot_weights == "exp"
    assert plain.autocast is None  # measured at the start of the run
    for flag, value in (("--autocast", True), ("--no-autocast", False)):
        assert dataclass_from_flags(TrainConfig, parser.parse_args(["train", "--data", "d", flag]), data=["d"]).autocast is value


@pytest.mark.parametrize("pays", [True, False])
def test_autocast_left_open_is_decided_by_this_machine_and_recorded(llama_target, tmp_path, monkeypatch, pays):
    """autocast=None: the run measures whether bf16 pays here, uses that, and records it (config and checkpoint
    fingerprint), so a resume on a machine that decides otherwise is refused, not silently mixed."""
    from hyflash.training import train as train_module

    used = []
    real_autocast = torch.autocast
    monkeypatch.setattr(train_module, "bf16_matmul_pays", lambda device: pays)

    def autocast(*args, **kwargs):  # the training step's (the memory scan switches autocast off inside it)
        if kwargs.get("dtype") is torch.bfloat16:
            used.append(kwargs["enabled"])
        return real_autocast(*args, **kwargs)

    monkeypatch.setattr(torch, "autocast", autocast)
    _tiny_data(llama_target, tmp_path / "d")
    config = _small_run(tmp_path / "d", tmp_path / "run", autocast=None, steps=2)
    train_module.train(config, progress=False, target=llama_target)
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["autocast"] is pays
    assert used and set(used) == {pays}
    monkeypatch.setattr(train_module, "bf16_matmul_pays", lambda device: not pays)
    with pytest.raises(HyflashError, match="autocast"):
        train_module.train(replace(config, steps=3), resume=True, progress=False, target=llama_target)


def _small_run(data_folder: Path, out: Path, **overrides) -> TrainConfig:
    settings = dict(data=[str(data_folder)], out=str(out), steps=4, batch_size=4, anchors=6, block_size=4,
                    window=8, chunk_size=4, draft_vocab_size=40, warmup_steps=1, save_every=2, log_every=1,
                    autocast=False, save_dtype="float32", plot=False)
    settings.update(overrides)
    return TrainConfig(**settings)


def test_checkpoint_round_trip_and_refusals(llama_target, tmp_path):
    from hyflash.training.train import build_drafter

    data = _tiny_data(llama_target, tmp_path / "d")
    config = _small_run(tmp_path / "d", tmp_path / "run")
    model = build_drafter(config, llama_target, data)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.fusion.proj.weight.sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    root = tmp_path / "ckpts"
    torch.manual_seed(123)
    path = ckpt.save_checkpoint(root, 7, model, opt, sched, config.fingerprint())
    expected_next = torch.rand(3)

    fresh = build_drafter(config, llama_target, data)
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    restored = ckpt.load_checkpoint(path, fresh, opt2, None, config.fingerprint())
    assert restored.step == 7
    assert torch.equal(torch.rand(3), expected_next)  # RNG state restored
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    saved_state, restored_state = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert saved_state.keys() == restored_state.keys() and saved_state
    for index in saved_state:
        assert torch.equal(saved_state[index]["exp_avg_sq"], restored_state[index]["exp_avg_sq"])

    other = _small_run(tmp_path / "d", tmp_path / "run", lr=5e-4)
    with pytest.raises(HyflashError, match="other settings.*lr"):
        ckpt.load_checkpoint(path, fresh, opt2, None, other.fingerprint())

    # A checkpoint from an older hyflash lacks settings added since: they resume at their defaults only.
    meta_file = path / "meta.json"
    meta = json.loads(meta_file.read_text())
    for name in ("onpolicy_objective", "init_from_target", "slot_weights"):
        del meta["fingerprint"][name]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(HyflashError, match="other settings.*onpolicy_objective"):
        ckpt.load_checkpoint(path, fresh, opt2, None, config.fingerprint())
    defaults = TrainConfig().fingerprint()
    assert ckpt.load_checkpoint(path, fresh, opt2, None, config.fingerprint(), defaults).step == 7
    for newer_setting in ({"onpolicy_objective": "acceptance"}, {"slot_weights": "survival"},
                          {"init_from_target": True}):
        newer = _small_run(tmp_path / "d", tmp_path / "run", **newer_setting)
        with pytest.raises(HyflashError, match=f"other settings.*{next(iter(newer_setting))}"):
            ckpt.load_checkpoint(path, fresh, opt2, None, newer.fingerprint(), defaults)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(HyflashError, match="corrupt"):
        ckpt.load_checkpoint(path, fresh, opt2, None, config.fingerprint())
    (path / "meta.json").write_text("{not json")
    with pytest.raises(HyflashError, match="corrupt"):
        ckpt.load_checkpoint(path, fresh, opt2, None, config.fingerprint())


def test_short_run_with_feature_cache_resume_guard_and_kl(llama_target, tmp_path):
    from hyflash.drafters.registry import load_drafter
    from hyflash.training.train import train

    _tiny_data(llama_target, tmp_path / "d")
    config = _small_run(tmp_path / "d", tmp_path / "run", feature_cache=str(tmp_path / "fc"), steps=6)
    drafter_dir = train(config, progress=False, target=llama_target)
    cached = list((tmp_path / "fc").rglob("*.safetensors"))
    assert len(cached) == 12  # every sequence's features were cached in epoch 0 and read in epoch 1
    records = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert load_drafter(drafter_dir, llama_target).block_size == 4
    with pytest.raises(HyflashError, match="--resume"):
        train(config, progress=False, target=llama_target)
    kl = _small_run(tmp_path / "d", tmp_path / "run-kl", loss="kl", steps=2)
    train(kl, progress=False, target=llama_target)


def test_run_initialised_from_target_with_survival_weights(llama_target, tmp_path, capsys):
    from safetensors.torch import load_file

    from hyflash.training.train import build_drafter, train

    data = _tiny_data(llama_target, tmp_path / "d")
    config = _small_run(tmp_path / "d", tmp_path / "run", steps=2, init_from_target=True, slot_weights="survival",
                        gamma=2.0, lr=0.0, warmup_steps=0, min_lr_ratio=1.0, grad_clip=0.0)
    model = build_drafter(config, llama_target, data)
    assert "init from target: drafter layers 0..0 <- target layers [3]" in capsys.readouterr().out
    last = llama_target.model.get_decoder().layers[3]
    assert torch.equal(model.layers[0].mlp_norm.weight, last.post_attention_layernorm.weight)
    assert torch.equal(model.layers[0].mlp.up.weight[:64], last.mlp.up_proj.weight)

    drafter = train(config, progress=False, target=llama_target)  # lr 0: the weights stay the initial copy
    assert torch.equal(load_file(str(drafter / "model.safetensors"))["layers.0.mlp.up.weight"], model.layers[0].mlp.up.weight)
    records = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    first, second = [r for r in records if "loss" in r]
    assert first["slot_weights"] == pytest.approx(position_weights(4, 2.0).tolist(), abs=1e-4)
    # After step 1 the EMA moved towards step 1's per-slot accuracy (one process: the global batch's).
    ema = [0.9 * np.exp(-0.5) + 0.1 * a for a in first["acc_by_slot"]]
    assert second["slot_weights"] == pytest.approx([1.0, ema[0], max(0.02, ema[0] * ema[1])], abs=1e-3)
    assert second["slot_weights"] != first["slot_weights"]
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step-000002" / "meta.json").read_text())
    assert len(meta["extra"]["slot_acceptance"]) == 3


def test_width_flags_shape_the_trained_drafter(llama_target, tmp_path):
    """`hyflash train --hidden-size 16 --num-heads 2 --intermediate-size 96` reaches the drafter config: a drafter
    of half the target's width trains and is exported with its width. An --init drafter keeps its own shape, and
    layers copied from the target need its width."""
    import argparse

    from hyflash.drafters.registry import load_drafter
    from hyflash.flags import dataclass_from_flags
    from hyflash.training.cli import add_cli
    from hyflash.training.train import build_drafter, train

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers())
    args = parser.parse_args(["train", "--data", "d", "--hidden-size", "16", "--num-heads", "2",
                              "--intermediate-size", "96"])
    flags = dataclass_from_flags(TrainConfig, args, data=args.data)
    width = {name: getattr(flags, name) for name in ("hidden_size", "num_heads", "intermediate_size")}
    assert width == {"hidden_size": 16, "num_heads": 2, "intermediate_size": 96}
    data = _tiny_data(llama_target, tmp_path / "d")
    config = _small_run(tmp_path / "d", tmp_path / "run", steps=2, eval_prompts=0, **width)
    drafter = load_drafter(train(config, progress=False, target=llama_target), llama_target, int8=False)
    shape = drafter.config
    assert (shape.hidden_size, shape.num_heads, shape.intermediate_size) == (16, 2, 96)
    assert drafter.model.out_proj.weight.shape == (llama_target.hidden_size, 16)
    records = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["loss"]) for r in records if "loss" in r)
    with pytest.raises(HyflashError, match="--init drafter keeps its own"):
        TrainConfig(init="runs/x/drafter", hidden_size=16)
    with pytest.raises(HyflashError, match="cannot be copied"):
        build_drafter(replace(config, init_from_target=True), llama_target, data)


def test_default_drafter_resolution():
    from hyflash.drafters.registry import SHIPPED_DRAFTERS, shipped_drafter_path

    with pytest.raises(HyflashError, match="no default drafter"):
        shipped_drafter_path("gemma3-270m")
    assert "smollm2-135m" in SHIPPED_DRAFTERS


def _tokenizer_or_skip():
    import os

    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set")
    from transformers import AutoTokenizer

    from hyflash.targets import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))


def test_build_dataset_resumes_extends_and_records_features(fake_stdlib, tmp_path):
    """The real SmolLM2 tokenizer (chat template included) on a tiny random model of the same vocabulary."""
    from conftest import tiny_llama

    from hyflash.targets import HFTarget
    from hyflash.training.data import DataConfig, build_dataset, read_manifest
    from hyflash.training.features import FeatureCache, teacher_features

    tok = _tokenizer_or_skip()
    target = HFTarget(tiny_llama(vocab=len(tok)), tok, name="tiny-smol")
    cfg = DataConfig(num_prompts=5, max_new_tokens=5, batch_size=2, shard_prompts=2, source_root=str(fake_stdlib),
                     sampled_fraction=0.5, dtype="float32")
    out = tmp_path / "data"
    build_dataset(cfg, out, target=target, progress=False, feature_cache=tmp_path / "fc")
    manifest = read_manifest(out)
    assert [s["sequences"] for s in manifest["shards"]] == [2, 2, 1] and manifest["complete"]
    first = (out / "shard-00001.safetensors").read_bytes()
    data = TokenDataset(out)
    seq, gen_start = data[0]
    assert seq.dtype == np.int64 and 0 < gen_start < len(seq) <= gen_start + 5
    # Recorded features equal a teacher-forced pass (fp32 target: up to rounding).
    cache = FeatureCache(tmp_path / "fc", target)
    recorded = cache.get(data.keys[0], len(seq))
    forced, _ = teacher_features(target, torch.as_tensor(seq)[None], torch.tensor([len(seq)]))
    torch.testing.assert_close(recorded[:-1], forced[0, :-1], rtol=1e-4, atol=1e-4)
    # Filed for a bfloat16 run: the bfloat16 cache folder holds them, rounded to bfloat16.
    build_dataset(cfg, tmp_path / "data-bf16", target=target, progress=False, feature_cache=tmp_path / "fc",
                  feature_dtype="bfloat16")
    as_bf16 = FeatureCache(tmp_path / "fc", target, torch.bfloat16)
    assert as_bf16.folder != cache.folder
    filed = as_bf16.get(data.keys[0], len(seq))
    assert filed.dtype == torch.bfloat16 and torch.equal(filed, recorded.to(torch.bfloat16))

    # A killed run: shard 1 never made it into the manifest. Resuming regenerates exactly it.
    manifest["shards"] = [s for s in manifest["shards"] if s["index"] != 1]
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "shard-00001.safetensors").unlink()
    build_dataset(cfg, out, target=target, progress=False)
    assert (out / "shard-00001.safetensors").read_bytes() == first
    # More prompts extend the folder: the partial last shard is redone, a new one added.
    cfg.num_prompts = 7
    build_dataset(cfg, out, target=target, progress=False)
    assert [s["sequences"] for s in read_manifest(out)["shards"]] == [2, 2, 2, 1]
    cfg.max_new_tokens = 9
    with pytest.raises(HyflashError, match="other settings"):
        build_dataset(cfg, out, target=target, progress=False)


def test_drafter_is_exported_before_the_final_evaluation(llama_target, tmp_path, monkeypatch):
    """A run that dies in its final held-out evaluation (as a GPU run once did) still leaves its drafter."""
    from hyflash.training import evaluate
    from hyflash.training import train as train_module

    _tiny_data(llama_target, tmp_path / "d")
    monkeypatch.setattr(train_module, "_heldout_prompts", lambda target, config: [[1, 2, 3]])

    def dies(*args, **kwargs):
        raise RuntimeError("evaluation died")

    monkeypatch.setattr(evaluate, "heldout_tau", dies)
    with pytest.raises(RuntimeError, match="evaluation died"):
        train_module.train(_small_run(tmp_path / "d", tmp_path / "run", steps=2), progress=False, target=llama_target)
    assert (tmp_path / "run" / "drafter" / "model.safetensors").exists()


def test_eval_at_adds_evaluations_at_the_listed_steps(llama_target, tmp_path, monkeypatch):
    from hyflash.training import evaluate
    from hyflash.training import train as train_module

    _tiny_data(llama_target, tmp_path / "d")
    monkeypatch.setattr(train_module, "_heldout_prompts", lambda target, config: [[1, 2, 3]])
    seen = []
    monkeypatch.setattr(evaluate, "heldout_tau", lambda model, *a: seen.append(1) or {"tau": float(len(seen))})
    train_module.train(_small_run(tmp_path / "d", tmp_path / "run", steps=5, eval_at="1,3"), progress=False,
                       target=llama_target)
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "eval" in r] == [1, 3, 5]  # the listed steps, then the end
    for bad in ("0", "ten", "3,-1"):
        with pytest.raises(HyflashError, match="--eval-at"):
            _small_run(tmp_path / "d", tmp_path / "bad", eval_at=bad)


def _cropped_data(target, folder: Path) -> tuple[TokenDataset, list[list[int]]]:
    """Sequences of 40, 25 and 60 tokens: with max_length 32 the first and last are cropped at the front."""
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, target.vocab_size, (n,), generator=g).tolist() for n in (40, 25, 60)]
    write_dataset(folder, seqs, [4, 4, 4], target.signature(), name="tiny")
    return TokenDataset(folder), seqs


def test_features_of_a_sequence_do_not_depend_on_its_batch(llama_target, tmp_path):
    """A sequence's features are those of its whole sequence (full context, as at inference) cropped like its
    tokens: the same alone, next to a shorter or a longer sequence, computed or read from the cache (fp32)."""
    from hyflash.training.features import FeatureCache, batch_features, teacher_features

    data, seqs = _cropped_data(llama_target, tmp_path / "d")

    def features_of(indices, cache=None) -> dict[int, torch.Tensor]:
        batch = make_batch(data, indices, num_anchors=4, block_size=4, max_length=32, seed=0, epoch=0)
        out, _ = batch_features(llama_target, batch, data, cache)
        return {i: out[j, : int(batch.lengths[j])] for j, i in enumerate(indices)}

    whole, _ = teacher_features(llama_target, torch.tensor([seqs[0]]), torch.tensor([40]))
    reference = whole[0, 40 - 32 :]  # the kept tokens' features, with the 8 cropped tokens as context
    close = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(features_of([0])[0], reference, **close)
    torch.testing.assert_close(features_of([0, 1])[0], reference, **close)  # next to a shorter sequence
    torch.testing.assert_close(features_of([2, 0])[0], reference, **close)  # next to a longer, cropped one
    cache = FeatureCache(tmp_path / "fc", llama_target)
    features_of([1], cache)  # only the short batch mate is cached
    torch.testing.assert_close(features_of([0, 1], cache)[0], reference, **close)
    assert cache.has(data.keys[0])  # cropped sequences are cached too, from their whole sequence
    torch.testing.assert_close(features_of([1, 0], cache)[0], reference, **close)  # now read from the cache


@pytest.mark.parametrize("family", ["llama_target", "gemma_target"])
def test_teacher_features_keep_only_the_feature_layers(request, family, monkeypatch):
    """The hook recorder gives what `output_hidden_states` does (fp32), without asking for every layer."""
    from hyflash.targets import HFTarget
    from hyflash.training.features import teacher_features

    target = HFTarget(request.getfixturevalue(family).model, feature_layers=(0, 1, 3, 4), name="four-features")
    tokens = torch.randint(0, 90, (2, 20), generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([14, 20])
    mask = (torch.arange(20)[None] < lengths[:, None]).long()
    with torch.no_grad():
        states = target.model(input_ids=tokens, attention_mask=mask, output_hidden_states=True).hidden_states
    expected = torch.stack([states[i] for i in target.feature_layers], dim=2)
    body = target.model.get_decoder()
    real = body.forward

    def no_all_layers(*args, **kwargs):
        assert not kwargs.get("output_hidden_states"), "teacher_features asked for every layer's hidden states"
        return real(*args, **kwargs)

    monkeypatch.setattr(body, "forward", no_all_layers)
    feats, _ = teacher_features(target, tokens, lengths)
    assert feats.shape == (2, 20, 4, target.hidden_size)
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(feats[row, :n], expected[row, :n], atol=1e-5, rtol=1e-5)


def test_kl_targets_are_the_distribution_that_predicts_each_slot_label(llama_target, tmp_path, monkeypatch):
    """Slot k of the block at anchor a is trained towards the target's distribution at a+k-1, which predicts
    its label tokens[a+k]: on greedy target-written data that distribution's argmax IS the label. Only those
    rows, and only the draft vocabulary's head rows, are computed (never [B, T, V] logits)."""
    from hyflash.training.features import batch_features

    data = _tiny_data(llama_target, tmp_path / "d", n=3, prompt=8, new=24)  # 32 tokens, greedy from token 8
    batch = make_batch(data, [0, 1, 2], num_anchors=6, block_size=4, max_length=20, seed=0, epoch=0)
    assert batch.offsets == [12, 12, 12]  # cropped: every label is a greedy token of the target

    def full_head(*args):
        raise AssertionError("the LM head ran over the whole vocabulary")

    monkeypatch.setattr(llama_target.model.get_output_embeddings(), "forward", full_head)
    _, logits = batch_features(llama_target, batch, data, None, want_logits=True)
    assert logits.shape == (3, 6, 3, llama_target.vocab_size) and logits.dtype == torch.float32
    valid = batch.labels >= 0
    assert valid.sum() > 30
    assert torch.equal(logits.argmax(-1)[valid], batch.labels[valid])
    monkeypatch.undo()
    with torch.no_grad():
        plain = llama_target.model(input_ids=torch.tensor(np.stack([data[i][0] for i in range(3)]))).logits
    for j in range(3):
        for i, a in enumerate(batch.anchors[j].tolist()):
            for k in range(1, 4):
                if batch.labels[j, i, k - 1] >= 0:
                    torch.testing.assert_close(logits[j, i, k - 1], plain[j, 12 + a + k - 1], atol=1e-4, rtol=1e-4)
    vocab = torch.randperm(llama_target.vocab_size, generator=torch.Generator().manual_seed(0))[:40]
    _, draft = batch_features(llama_target, batch, data, None, want_logits=True, vocab_ids=vocab)
    torch.testing.assert_close(draft, logits[..., vocab], atol=1e-5, rtol=1e-5)


def test_length_groups_bound_the_padding_of_each_pass():
    from hyflash.training.features import length_groups

    assert length_groups([500, 8207, 450, 400]) == [[1], [0, 2, 3]]  # the 8k sequence alone, not padded to
    assert length_groups([32, 32, 32]) == [[0, 1, 2]]
    lengths = [int(n) for n in torch.randint(1, 4000, (40,), generator=torch.Generator().manual_seed(0))]
    groups = length_groups(lengths, max_padding=0.25)
    assert sorted(i for g in groups for i in g) == list(range(40))
    for g in groups:
        assert max(lengths[i] for i in g) * len(g) <= 1.25 * sum(lengths[i] for i in g)


def test_features_and_logits_computed_in_length_groups_equal_one_padded_batch(llama_target, tmp_path, monkeypatch):
    """Sequences of 40, 25 and 60 tokens run as two passes ([60, 40], [25]); features and KL logits come back
    in the batch's order, equal to the single padded pass over all three."""
    from hyflash.training import features as features_module

    data, _ = _cropped_data(llama_target, tmp_path / "d")
    batch = make_batch(data, [0, 1, 2], num_anchors=4, block_size=4, max_length=32, seed=0, epoch=0)
    assert features_module.length_groups([40, 25, 60]) == [[2, 0], [1]]
    grouped, grouped_logits = features_module.batch_features(llama_target, batch, data, None, want_logits=True)
    monkeypatch.setattr(features_module, "length_groups", lambda lengths: [list(range(len(lengths)))])
    padded, padded_logits = features_module.batch_features(llama_target, batch, data, None, want_logits=True)
    torch.testing.assert_close(grouped, padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grouped_logits, padded_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["full", "local", "memory", "hyflash"])
def test_blocks_read_only_the_context_before_their_anchor_and_their_anchor_token(llama_target, kind):
    """The block at anchor a depends on features[:a] and tokens[a] only: not on its labels tokens[a+1..], not
    on features from a on, not on which other anchors share the pass, nor on their tokens or the batch mates."""
    from hyflash.drafters.config import DrafterConfig
    from hyflash.drafters.model import DrafterModel

    torch.manual_seed(0)
    config = DrafterConfig.for_target(llama_target, kind=kind, window=8, chunk_size=4, block_size=5, num_heads=2,
                                      head_dim=8, num_layers=2)
    model = DrafterModel(config, llama_target).double()
    g = torch.Generator().manual_seed(1)
    T, a, V = 40, 21, llama_target.vocab_size
    features = torch.randn(1, T, len(llama_target.feature_layers), llama_target.hidden_size, generator=g,
                           dtype=torch.float64)
    tokens = torch.randint(0, V, (1, T), generator=g)
    before = model.train_forward(features, tokens, torch.tensor([[a, a + 1, 30]]))[0, 0]

    features2, tokens2 = features.clone(), tokens.clone()
    features2[:, a:] += torch.randn(features2[:, a:].shape, generator=g, dtype=torch.float64)
    tokens2[:, a + 1 :] = (tokens2[:, a + 1 :] + 1) % V  # the labels and the next anchor's token
    other = (torch.randn(features.shape, generator=g, dtype=torch.float64), torch.randint(0, V, (1, T), generator=g))
    after = model.train_forward(torch.cat([other[0], features2]), torch.cat([other[1], tokens2]),
                                torch.tensor([[3, 17, a, 39], [35, a, a + 1, 5]]))  # a at slot 1 of row 1
    torch.testing.assert_close(after[1, 1], before, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(after[1, 2], model.train_forward(features2, tokens2, torch.tensor([[a + 1]]))[0, 0],
                               atol=1e-10, rtol=1e-10)
    # Not vacuous: the block does read its anchor token and the context just before it.
    tokens3, features3 = tokens.clone(), features.clone()
    tokens3[0, a] = (tokens3[0, a] + 1) % V
    features3[0, a - 1] += 1.0
    assert not torch.allclose(model.train_forward(features, tokens3, torch.tensor([[a]]))[0, 0], before)
    assert not torch.allclose(model.train_forward(features3, tokens, torch.tensor([[a]]))[0, 0], before)


def test_heldout_prompts_depend_on_the_eval_seed_not_the_training_seed():
    """Runs with different --seed values are scored on the same held-out prompts (so their tau compares)."""
    from types import SimpleNamespace

    from hyflash.training.config import TrainConfig
    from hyflash.training.train import _heldout_prompts

    fake = SimpleNamespace(tokenizer=object(), encode_prompt=lambda text, chat: [ord(c) for c in text[-64:]])
    base = _heldout_prompts(fake, TrainConfig(seed=0, eval_prompts=3))
    assert len(base) == 3
    assert _heldout_prompts(fake, TrainConfig(seed=7, eval_prompts=3)) == base
    assert _heldout_prompts(fake, TrainConfig(seed=0, eval_prompts=3, eval_seed=2)) != base


def test_features_computed_in_float32_are_filed_for_the_bfloat16_run(tmp_path, monkeypatch):
    """--feature-compute-dtype float32 (a bf16 run on a CPU without native bf16): the features come from the
    float32 model, are cast to bf16 and cached under the bf16 target's own key, so the cache is one for both.
    Like the bf16 target's own pass, it reads whole sequences longer than the model's context (long-v1 holds
    8,207-token ones for an 8,192-token SmolLM2; a prefill refused them)."""
    from conftest import tiny_llama

    from hyflash.targets import HFTarget
    from hyflash.training import train as train_module
    from hyflash.training.features import FeatureCache, batch_features

    fp32 = HFTarget(tiny_llama(), name="tiny-llama")
    bf16 = HFTarget(tiny_llama().to(torch.bfloat16), name="tiny-llama")
    fp32.max_context = bf16.max_context = 32  # sequence 0 has 40 tokens
    loaded = []
    monkeypatch.setattr(HFTarget, "load", classmethod(lambda cls, model, dtype: loaded.append(dtype) or fp32))
    data, _ = _cropped_data(bf16, tmp_path / "d")
    config = TrainConfig(model="tiny", dtype="bfloat16", feature_compute_dtype="float32")
    source = train_module.feature_source(config, bf16, data)
    assert source is fp32 and loaded == ["float32"]
    same = TrainConfig(dtype="bfloat16", feature_compute_dtype="bfloat16")
    assert train_module.feature_source(same, bf16, data) is None

    cache = FeatureCache(tmp_path / "fc", source, bf16.dtype)  # as train() opens it
    assert cache.folder == FeatureCache(tmp_path / "fc", bf16).folder
    batch = make_batch(data, [0, 1], num_anchors=4, block_size=4, max_length=32, seed=0, epoch=0)
    got, _ = batch_features(bf16, batch, data, cache, source=source)
    own, _ = batch_features(bf16, batch, data, None)
    assert got.dtype == torch.bfloat16 and cache.has(data.keys[0]) and cache.has(data.keys[1])
    torch.testing.assert_close(got.float(), own.float(), atol=0.1, rtol=0.05)  # bf16 rounding, not other numbers
    exact, _ = batch_features(fp32, batch, data, None)
    assert torch.equal(got, exact.to(torch.bfloat16))  # fp32's numbers, in bf16
    with pytest.raises(HyflashError, match="feature_compute_dtype"):
        TrainConfig(feature_compute_dtype="int8")


def test_train_step_speed_refuses_bad_settings_before_loading_anything(tmp_path, capsys):
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "experiments" / "training-speed" / "train_step_speed.py"
    spec = importlib.util.spec_from_file_location("train_step_speed", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--out", str(tmp_path), "--settings", "on,maybe"]) == 2
    assert "--settings takes on, off and auto" in capsys.readouterr().err
    assert script.main(["--out", str(tmp_path), "--steps", "1"]) == 2
    assert "--steps must be >= 2" in capsys.readouterr().err and not list(tmp_path.iterdir())
