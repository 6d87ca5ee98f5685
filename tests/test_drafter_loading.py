"""Checkpoints, every loading error, lossless generation with untrained drafters, and the drafter CLI."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_llama
from test_drafter_model import _with_copy_weights, make, sequence

from hyflash.cli import main
from hyflash.decoding import generate
from hyflash.drafters.config import KINDS
from hyflash.drafters.registry import SHIPPED_DRAFTERS, load_drafter
from hyflash.drafters.model import DrafterModel
from hyflash.drafters.state import DrafterState
from hyflash.errors import HyflashError
from hyflash.sampling import SamplingConfig
from hyflash.targets import HFTarget


@pytest.fixture
def saved(llama_target, tmp_path):
    model = make(llama_target, dtype=torch.float32, draft_vocab_size=50)
    model.set_draft_vocab(torch.arange(50) * 2 % llama_target.vocab_size)
    return model, model.save_pretrained(tmp_path / "drafter")


def test_save_load_round_trip(llama_target, saved):
    model, path = saved
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary folders left
    loaded = DrafterModel.from_pretrained(path, llama_target)
    assert loaded.config == model.config
    assert torch.equal(loaded.draft_vocab_ids, model.draft_vocab_ids)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert all(t.shape[0] != llama_target.vocab_size for t in loaded.state_dict().values())  # no target pieces
    features, tokens = sequence(llama_target, 40, dtype=torch.float32)
    anchors = torch.tensor([[3, 17, 30]])
    expected = model.train_forward(features, tokens, anchors)
    torch.testing.assert_close(loaded.train_forward(features, tokens, anchors), expected)
    model.save_pretrained(path)  # saving over an existing folder replaces it atomically
    assert isinstance(load_drafter(path, llama_target), DrafterState)


def test_a_narrow_drafter_round_trips_and_drafts_the_same(llama_target, tmp_path):
    """A drafter of half the target's width saves its width and out_proj; loaded, it drafts exactly what it
    drafted before; in int8 (out_proj quantised, the head reading its output) it stays close and lossless."""
    H = llama_target.hidden_size
    model = _with_copy_weights(make(llama_target, dtype=torch.float32, hidden_size=H // 2, copy_ngram=3,
                                    copy_gate=True, draft_vocab_size=50))
    model.set_draft_vocab(torch.arange(50) * 2 % llama_target.vocab_size)
    path = model.save_pretrained(tmp_path / "narrow")
    assert json.loads((path / "config.json").read_text())["hidden_size"] == H // 2
    loaded = DrafterModel.from_pretrained(path, llama_target)
    assert loaded.config == model.config and loaded.out_proj.weight.shape == (H, H // 2)
    assert loaded.state_dict().keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    features, tokens = sequence(llama_target, 40, dtype=torch.float32)
    tokens = tokens % 6  # repeats: the copy input has candidates
    states = [DrafterState(model), DrafterState(loaded), load_drafter(path, llama_target, int8=True)]
    for state in states:
        state.ingest(tokens[0, :29], features[0, :29])
    logits = [state.model.logits(state.block_hidden(5, state.copy_candidates(5))) for state in states]
    assert torch.equal(logits[1], logits[0])
    drafts = [state.draft(5, 4, SamplingConfig(), None) for state in states[:2]]
    assert drafts[1].tokens.tolist() == drafts[0].tokens.tolist()
    assert torch.equal(drafts[1].slot_probs, drafts[0].slot_probs)
    int8 = states[2]
    assert int8.model.int8_head is not None and not isinstance(int8.model.out_proj, torch.nn.Linear)
    assert (logits[2] - logits[0]).abs().max() < 0.1 * logits[0].abs().max()
    prompt = tokens[0, :23]
    plain = generate(llama_target, prompt, None, max_new_tokens=30)
    assert generate(llama_target, prompt, int8, max_new_tokens=30).tokens == plain.tokens


def test_a_drafter_loaded_inside_inference_mode_drafts_as_one_loaded_outside(llama_target, saved):
    """Its draft vocabulary is then an inference tensor, which keeps no version counter: the head and index
    caches keyed on it failed with "Inference tensors do not track version counter"."""
    _, path = saved
    outside = load_drafter(path, llama_target)
    with torch.inference_mode():
        inside = load_drafter(path, llama_target)
        assert inside.model.draft_vocab_ids.is_inference()
        hidden = torch.randn(3, inside.model.config.target_hidden_size)
        torch.testing.assert_close(inside.model.logits(hidden), outside.model.logits(hidden))
        ids = torch.tensor([0, 2, 3, -1])
        assert torch.equal(inside.model.draft_index(ids), outside.model.draft_index(ids))


def test_drafters_of_the_targets_width_keep_their_checkpoint(llama_target, tmp_path):
    """hidden_size 0 (the default, and what a config.json written before the field reads as) or the target's own
    width: no out_proj and the tensors drafters always had, so older drafters, the shipped one among them, load
    and draft as before."""
    model = make(llama_target, dtype=torch.float32, num_layers=1, copy_ngram=3, copy_gate=True, draft_vocab_size=50)
    layer = {"attn_norm.weight": (32,), "q_proj.weight": (16, 32), "k_proj.weight": (16, 32),
             "v_proj.weight": (16, 32), "o_proj.weight": (32, 16), "q_norm.weight": (8,), "k_norm.weight": (8,),
             "mlp_norm.weight": (32,), "mlp.gate.weight": (128, 32), "mlp.up.weight": (128, 32),
             "mlp.down.weight": (32, 128), "memory_gates.weight": (4, 32), "memory_gates.bias": (4,),
             "memory_out_gate.weight": (2, 32), "memory_out_gate.bias": (2,)}
    expected = {"fusion.layer_norm_weight": (1, 32), "fusion.proj.weight": (32, 32), "fusion.norm.weight": (32,),
                "mask_embedding": (32,), "anchor_proj.weight": (32, 32), "context_proj.weight": (32, 32),
                "copy_proj.weight": (32, 32), "copy_length.weight": (4, 32), "copy_gate.weight": (1, 32),
                "copy_gate.bias": (1,), **{f"layers.0.{k}": v for k, v in layer.items()}, "norm.weight": (32,),
                "draft_vocab_ids": (50,)}
    assert {name: tuple(t.shape) for name, t in model.state_dict().items()} == expected
    same = make(llama_target, dtype=torch.float32, num_layers=1, copy_ngram=3, copy_gate=True, draft_vocab_size=50,
                hidden_size=llama_target.hidden_size)
    assert same.out_proj is None and same.state_dict().keys() == model.state_dict().keys()
    # A config.json from before the field: no hidden_size key.
    path = model.save_pretrained(tmp_path / "old")
    data = json.loads((path / "config.json").read_text())
    del data["hidden_size"]
    (path / "config.json").write_text(json.dumps(data))
    loaded = DrafterModel.from_pretrained(path, llama_target)
    assert loaded.config.hidden_size == llama_target.hidden_size and loaded.out_proj is None
    features, tokens = sequence(llama_target, 30, dtype=torch.float32)
    anchors = torch.tensor([[4, 17, 26]])
    assert torch.equal(loaded.train_forward(features, tokens, anchors), model.train_forward(features, tokens, anchors))

    from hyflash.drafters.loading import read_config, read_weights
    from hyflash.drafters.registry import shipped_drafter_path

    shipped = shipped_drafter_path("smollm2-135m")
    assert "hidden_size" not in json.loads((shipped / "config.json").read_text())
    config = read_config(shipped)

    class Signature:  # enough of SmolLM2 to build its drafter and load the weights (no forward pass)
        name = "smollm2-135m"

        def signature(self):
            return config.signature()

    drafter = DrafterModel(config, Signature())
    assert config.hidden_size == config.target_hidden_size == 576 and drafter.out_proj is None
    drafter.load_state_dict(read_weights(shipped), strict=True)


@pytest.mark.parametrize("model", sorted(SHIPPED_DRAFTERS))
def test_every_shipped_drafter_loads_strictly_for_its_model_and_fits_the_size_limit(model):
    """Each built-in model's default drafter is a complete folder for that model: its config names the model,
    every weight tensor loads with strict=True into the drafter its config builds, and the weights stay within
    the 25 MB a package may ship (issue 37)."""
    from hyflash.drafters.loading import read_config, read_weights
    from hyflash.drafters.registry import shipped_drafter_path

    folder = shipped_drafter_path(model)
    config = read_config(folder)
    assert config.target_name == model

    class Signature:  # enough of the target to build its drafter and load the weights (no forward pass)
        name = model

        def signature(self):
            return config.signature()

    DrafterModel(config, Signature()).load_state_dict(read_weights(folder), strict=True)
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 25 * 1024**2


def _corrupt(path, what):
    if what == "missing folder":
        return path.parent / "nowhere"
    if what == "no config":
        (path / "config.json").unlink()
    elif what == "bad json":
        (path / "config.json").write_text("{not json")
    elif what == "not ours":
        (path / "config.json").write_text('{"model_type": "llama"}')
    elif what == "bad value":
        data = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**data, "kind": "bogus"}))
    elif what == "no weights":
        (path / "model.safetensors").unlink()
    elif what == "corrupt weights":
        (path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    elif what == "wrong weights":
        data = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**data, "num_layers": 3}))
    return path


@pytest.mark.parametrize(
    "what,needle",
    [("missing folder", "no drafter folder"), ("no config", "no config.json"), ("bad json", "corrupt"),
     ("not ours", "not a hyflash drafter"), ("bad value", "kind 'bogus'"), ("no weights", "no model.safetensors"),
     ("corrupt weights", "corrupt"), ("wrong weights", "do not match")],
)
def test_unreadable_checkpoints_fail_clearly(llama_target, saved, what, needle):
    path = _corrupt(saved[1], what)
    with pytest.raises(HyflashError, match=needle) as info:
        load_drafter(path, llama_target)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "target_kwargs,feature_layers,needle",
    [(dict(hidden=48), None, "hidden size 32, but .* has 48"), (dict(vocab=103), None, "vocabulary size 97"),
     (dict(layers=6), None, "layer count 4"), ({}, (1, 2), r"feature layers \[1\], but .* has \[1, 2\]")],
)
def test_wrong_target_names_the_mismatch(saved, target_kwargs, feature_layers, needle):
    other = HFTarget(tiny_llama(**target_kwargs), feature_layers=feature_layers, name="other")
    with pytest.raises(HyflashError, match=needle):
        load_drafter(saved[1], other)


@pytest.mark.parametrize("kind", KINDS)
def test_untrained_drafters_keep_greedy_output_exact(llama_target, tmp_path, kind):
    model = make(llama_target, dtype=torch.float32, kind=kind, memory_rule="gated_delta")
    drafter = load_drafter(model.save_pretrained(tmp_path / kind), llama_target)
    prompt = torch.randint(0, llama_target.vocab_size, (23,), generator=torch.Generator().manual_seed(2))
    plain = generate(llama_target, prompt, None, max_new_tokens=40)
    spec = generate(llama_target, prompt, drafter, max_new_tokens=40)
    assert spec.tokens == plain.tokens
    assert spec.draft_memory_bytes == drafter.memory_bytes() > 0
    sampled = generate(llama_target, prompt, drafter, max_new_tokens=20, sampling=SamplingConfig(temperature=1.0))
    assert len(sampled.tokens) == 20


def test_cli_new_and_info(llama_target, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(HFTarget, "load", classmethod(lambda cls, *args, **kwargs: llama_target))
    out = tmp_path / "d"
    assert main(["drafter", "new", "--kind", "hyflash", "--window", "8", "--memory", "delta", "--block-size", "5",
                 "--model", "tiny", "--out", str(out)]) == 0
    assert "hyflash drafter" in capsys.readouterr().out
    assert main(["drafter", "info", str(out), "--context", "16,64,256", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["memory_rule"] == "delta" and info["config"]["window"] == 8
    assert info["param_count"] == DrafterModel.from_pretrained(out, llama_target).param_count()
    assert len(set(info["draft_memory_bytes"].values())) == 1  # constant in context length
    assert main(["drafter", "info", str(out), "--context", "100"]) == 0
    text = capsys.readouterr().out
    assert "draft memory" in text and "width 32, block 5" in text
    narrow = tmp_path / "narrow"
    assert main(["drafter", "new", "--kind", "hyflash", "--hidden-size", "16", "--model", "tiny",
                 "--out", str(narrow)]) == 0
    assert main(["drafter", "info", str(narrow), "--context", "16"]) == 0
    assert "width 16 (projected to the target's 32 for its LM head)" in capsys.readouterr().out
    assert main(["drafter", "info", str(out), "--context", "x"]) == 2
    assert main(["drafter", "info", str(tmp_path / "missing")]) == 2
    assert "no drafter folder" in capsys.readouterr().err


@pytest.mark.slow
def test_untrained_drafters_on_the_real_model(smollm2_fp32, tmp_path):
    """`hyflash drafter new` for SmolLM2, then speculative decoding with each kind equals plain greedy (fp32)."""
    prompt = smollm2_fp32.encode_prompt("Write a Python function that reverses a string.")
    plain = generate(smollm2_fp32, prompt, None, max_new_tokens=12)
    for kind in KINDS:
        out = tmp_path / kind
        assert main(["drafter", "new", "--kind", kind, "--window", "16", "--out", str(out)]) == 0
        spec = generate(smollm2_fp32, prompt, load_drafter(out, smollm2_fp32), max_new_tokens=12)
        assert spec.tokens == plain.tokens, kind


def test_int8_drafter_is_cheaper_close_and_lossless(llama_target, saved):
    """CPU inference quantises the drafter's weights (never the target's): its logits stay close to the float
    drafter's, its weights shrink, and greedy output is still exactly plain decoding."""
    _, path = saved
    exact = load_drafter(path, llama_target, int8=False)
    int8 = load_drafter(path, llama_target, int8=True)
    assert int8.model.int8_head is not None and exact.model.int8_head is None
    prompt = list(range(3, 40))
    out = llama_target.prefill(torch.tensor(prompt))
    for state in (exact, int8):
        state.reset()
        state.ingest(torch.tensor(prompt), out.features)
    h_exact, h_int8 = exact.block_hidden(7), int8.block_hidden(7)
    l_exact, l_int8 = exact.model.logits(h_exact), int8.model.logits(h_int8)
    assert (l_exact - l_int8).abs().max() < 0.1 * l_exact.abs().max()
    plain = generate(llama_target, prompt, None, max_new_tokens=20)
    assert generate(llama_target, prompt, int8, max_new_tokens=20).tokens == plain.tokens


def test_a_training_run_folder_is_a_drafter_spec(tmp_path, monkeypatch, capsys):
    """`hyflash train --out RUN` saves its drafter to RUN/drafter and says so; `--drafter RUN` must then work
    as well as `--drafter RUN/drafter` (it failed with "RUN has no config.json")."""
    from bench_fixtures import word_target

    from hyflash.drafters import registry
    from hyflash.drafters.loading import TRAINED_SUBFOLDER, read_config

    target = word_target()
    model_dir = tmp_path / "model"
    target.model.save_pretrained(model_dir)  # a real folder, so the model's config can be read before loading
    monkeypatch.setattr(HFTarget, "load", classmethod(lambda cls, *args, **kwargs: target))
    run = tmp_path / "run"
    model = make(target, dtype=torch.float32)
    model.save_pretrained(run / TRAINED_SUBFOLDER)
    assert registry.resolve_spec(str(run), "tiny") == str(run / TRAINED_SUBFOLDER)
    assert registry.needs_features(str(run), "tiny") and not registry.needs_features("ngram", "tiny")
    assert read_config(run) == model.config
    drafter = registry.build_drafter(str(run), target)
    assert isinstance(drafter, DrafterState) and drafter.config == model.config
    prompt = ["--prompt", "def add ( a , b ) : return a + b", "--no-chat", "--max-new-tokens", "6",
              "--dtype", "float32", "--no-adaptive", "--model", str(model_dir)]
    assert main(["generate", *prompt, "--drafter", str(run), "--json"]) == 0
    via_run = json.loads(capsys.readouterr().out)
    assert main(["generate", *prompt, "--drafter", "none", "--json"]) == 0
    assert via_run["tokens"] == json.loads(capsys.readouterr().out)["tokens"]  # lossless, and it did run
    assert via_run["target_passes"] <= 6
    with pytest.raises(HyflashError, match="no drafter folder"):
        registry.build_drafter(str(tmp_path / "nowhere"), target)
