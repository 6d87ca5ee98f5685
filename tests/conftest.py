"""Shared fixtures: tiny random Llama and Gemma-3 targets (fp32, fast) and the real default model (slow)."""

from __future__ import annotations

import os

import pytest
import torch

# Tiny models dominate the suite: one thread avoids thread-pool stalls (7-20x faster on a busy 2-core machine).
# Real-model CLI tests run in subprocesses with torch's default threads.
torch.set_num_threads(1)
# Tests assert llama.cpp's and hyflash's default settings: a configuration searched on this machine (`hyflash
# calibrate --search-config`) must not reach them, nor the CLI subprocesses they start.
os.environ["HYFLASH_NO_SEARCHED_SETTINGS"] = "1"


def import_llama_cpp():
    """llama_cpp, or skip the calling test module without it; under CI (CI=true) a missing llama_cpp fails
    instead, so that a failed llama-cpp-python build cannot leave the suite green with its tests skipped."""
    try:
        import llama_cpp
    except ImportError as exc:
        why = f"llama-cpp-python is not importable ({exc}; pip install llama-cpp-python==0.3.36, or make venv)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}, and CI=true: the backend must be there", pytrace=False)
        pytest.skip(why, allow_module_level=True)
    return llama_cpp


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """In-process CLI tests (`main([...])`) set torch's threads to the machine's cores; later tests get 1 again."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _calibration_on_an_idle_machine(monkeypatch):
    """Tests run beside each other (pytest -n 2), so the calibration would see a busy CPU and cache nothing; it
    reads the machine as idle unless a test says otherwise (test_a_curve_timed_on_a_busy_machine_is_not_cached)."""
    monkeypatch.setattr("hyflash.calibration.others_cpu_share", lambda before, after: 0.0)


def _sharpen(model, scale: float = 10.0) -> None:
    """Random init gives near-uniform logits (and tied heads just repeat the last token). An untied, scaled
    head gives varied text with a top probability around 0.2-0.8: no near-ties, still worth sampling."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)


def tiny_llama(seed: int = 0, vocab: int = 97, layers: int = 4, hidden: int = 32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).float().eval()
    _sharpen(model)
    return model


def tiny_gemma3(seed: int = 0, vocab: int = 101, layers: int = 4, hidden: int = 32, sliding_window: int = 8):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"] * (layers // 2),
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model = Gemma3ForCausalLM(config).float().eval()
    _sharpen(model)
    return model


@pytest.fixture(scope="session")
def llama_target():
    from hyflash.targets import HFTarget

    return HFTarget(tiny_llama(), name="tiny-llama")


@pytest.fixture(scope="session")
def gemma_target():
    from hyflash.targets import HFTarget

    return HFTarget(tiny_gemma3(), name="tiny-gemma3")


@pytest.fixture(scope="session")
def smollm2_fp32():
    """The real default target in fp32 (converted once into the user cache, then ~1 s to load)."""
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set")
    from hyflash.targets import HFTarget

    return HFTarget.load("smollm2-135m", dtype="float32")
