"""The llama.cpp backend on the real SmolLM2 GGUF as shipped (Q4_1): same plain greedy text as llama.cpp's own
decoding, lossless speculative decoding, exact rollback, features close to the transformers backend's, and the
embedding / LM head a drafter borrows."""

from __future__ import annotations

import os

import pytest
import torch

from drafters_for_tests import RandomDrafter
from hyflash.decoding import generate
from hyflash.drafters.ngram import NgramDrafter
from hyflash.errors import HyflashError
from hyflash.targets import load_target

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed (pip install llama-cpp-python==0.3.36)"
)

PROMPTS = [
    "Write a Python function that reverses a string.",
    "Explain photosynthesis in two sentences.",
    "List three prime numbers and explain why they are prime.",
]


@pytest.fixture(scope="module")
def lcpp():
    """The built-in SmolLM2 on llama.cpp, 1 thread like the rest of the suite (conftest)."""
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set")
    return load_target("smollm2-135m", "auto", "llama.cpp")


def _llama_cpp_greedy(target, prompt_ids: list[int], n: int) -> list[int]:
    """llama.cpp's own greedy decoding (llama_cpp.Llama, temperature 0) of the same file and settings."""
    llm = llama_cpp.Llama(str(target.path), n_ctx=2048, n_threads=target.threads, n_batch=512,
                          flash_attn=target.flash_attn, verbose=False)
    out: list[int] = []
    for tok in llm.generate(prompt_ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if len(out) >= n or tok in target.eos_token_ids:  # its end-of-generation set (llama_vocab_is_eog)
            break
    return out


def _random_block(target, n: int, seed: int) -> list[int]:
    return torch.randint(0, target.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.slow
def test_plain_greedy_equals_llama_cpps_own_greedy(lcpp):
    for text in PROMPTS[:2]:
        ids = lcpp.encode_prompt(text)
        plain = generate(lcpp, ids, None, max_new_tokens=32)
        assert plain.tokens == _llama_cpp_greedy(lcpp, ids, 32), text


@pytest.mark.slow
def test_speculative_greedy_equals_plain(lcpp):
    """Block of 8: n-gram drafts (mostly accepted on repeats) and random drafts (mostly rejected: rollback on
    nearly every pass)."""
    for text in PROMPTS:
        ids = lcpp.encode_prompt(text)
        plain = generate(lcpp, ids, None, max_new_tokens=40)
        for drafter in (NgramDrafter(block_size=8), RandomDrafter(lcpp.vocab_size, block_size=8)):
            spec = generate(lcpp, ids, drafter, max_new_tokens=40)
            assert spec.tokens == plain.tokens, (text, type(drafter).__name__)
            assert spec.target_passes <= plain.target_passes


@pytest.mark.slow
def test_block_pass_equals_one_token_passes(lcpp):
    """Why speculative output is exactly plain output on this backend: with flash attention (the default) a
    q-token pass gives the logits and features of q one-token passes (bit-identical on the 2-core Zen 3 this
    was written on; tolerance for others). Without flash attention, q = 8 differs by up to 0.9% (relative
    logits) and q = 16 by 2%, enough to flip an argmax."""
    ids = lcpp.encode_prompt(PROMPTS[0])
    block = _random_block(lcpp, 8, 0)
    lcpp.prefill(ids, features=False)
    batched = lcpp.score(block)
    lcpp.rollback(len(ids))
    singles = [lcpp.score([t]) for t in block]
    torch.testing.assert_close(batched.logits, torch.cat([s.logits for s in singles]), atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(batched.features, torch.cat([s.features for s in singles]), atol=1e-3, rtol=1e-4)
    assert torch.equal(batched.logits.argmax(-1), torch.cat([s.logits for s in singles]).argmax(-1))


@pytest.mark.slow
def test_rollback_then_score_equals_fresh_prefill(lcpp):
    ids = lcpp.encode_prompt(PROMPTS[1])
    block, other = _random_block(lcpp, 8, 1), _random_block(lcpp, 5, 2)
    out = lcpp.prefill(ids)
    assert out.logits.shape == (1, lcpp.vocab_size) and lcpp.cache_length == len(ids)
    scored = lcpp.score(block)
    assert scored.logits.shape == (8, lcpp.vocab_size) and scored.features.shape == (8, 5, 576)
    lcpp.rollback(len(ids) + 2)
    assert lcpp.cache_length == len(ids) + 2
    after = lcpp.score(other)
    fresh = lcpp.prefill(ids + block[:2] + other)
    torch.testing.assert_close(after.logits[-1:], fresh.logits, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(after.features, fresh.features[-5:], atol=1e-3, rtol=1e-4)
    with pytest.raises(ValueError):
        lcpp.rollback(lcpp.cache_length + 1)
    lcpp.reset()
    assert lcpp.cache_length == 0


@pytest.mark.slow
def test_features_close_to_the_transformers_target(lcpp, smollm2_fp32):
    """Same tokens, same feature layers: Q4_1 weights with 8-bit activations vs the dequantised fp32 model.
    Measured 2026-12-01: median relative error per layer 1.0% (layer 1) to 2.8% (layer 27), max 5.2%."""
    assert lcpp.signature() == smollm2_fp32.signature()
    ids = lcpp.encode_prompt(PROMPTS[0])
    assert ids == smollm2_fp32.encode_prompt(PROMPTS[0])  # the same tokenizer and chat template
    ours, theirs = lcpp.prefill(ids), smollm2_fp32.prefill(ids)
    assert ours.features.shape == (len(ids), 5, 576) and ours.features.dtype == torch.float32
    for j, layer in enumerate(lcpp.feature_layers):
        a, b = ours.features[:, j], theirs.features[:, j]
        rel = (a - b).norm(dim=-1) / b.norm(dim=-1)
        assert rel.median() < 0.08 and rel.max() < 0.2, (layer, rel.median().item(), rel.max().item())
    # The same next token, and logits close.
    assert ours.logits.argmax() == theirs.logits.argmax()
    assert (ours.logits - theirs.logits).norm() / theirs.logits.norm() < 0.05


@pytest.mark.slow
def test_the_borrowed_embedding_and_head(lcpp, smollm2_fp32):
    head = lcpp.head_weight()
    assert head.shape == (49152, 576) and head.dtype == torch.float32
    rows = torch.tensor([0, 1, 2, 100, 4590, 49151])
    torch.testing.assert_close(head[rows], smollm2_fp32.head_weight()[rows].float(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lcpp.embed(rows), smollm2_fp32.embed(rows).float(), atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_the_shipped_drafter_runs_on_llama_cpp_features_losslessly(lcpp):
    """A drafter trained on transformers features borrows this backend's head and reads its features."""
    from hyflash.drafters.loading import load_drafter_for_target
    from hyflash.training.defaults import default_drafter_path

    drafter = load_drafter_for_target(default_drafter_path("smollm2-135m"), lcpp)
    ids = lcpp.encode_prompt(PROMPTS[0])
    plain = generate(lcpp, ids, None, max_new_tokens=40)
    spec = generate(lcpp, ids, drafter, max_new_tokens=40)
    assert spec.tokens == plain.tokens
    assert spec.tau > 1.0


def test_bad_input_gets_a_one_line_error(tmp_path):
    with pytest.raises(HyflashError, match="no GGUF file"):
        load_target(str(tmp_path / "missing.gguf"), "auto", "llama.cpp")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(500))
    with pytest.raises(HyflashError, match="corrupt"):
        load_target(str(bad), "auto", "llama.cpp")
    with pytest.raises(HyflashError, match="not a built-in name"):
        load_target(str(tmp_path), "auto", "llama.cpp")
    with pytest.raises(HyflashError, match="does not apply"):
        load_target("smollm2-135m", "float32", "llama.cpp")
    with pytest.raises(HyflashError, match="unknown backend"):
        load_target("smollm2-135m", "float32", "onnx")


@pytest.mark.slow
def test_a_target_without_the_eval_callback_decodes_the_same_text(lcpp):
    """record_features=False (plain decoding, feature-free drafters) drops the callback, not correctness."""
    bare = load_target("smollm2-135m", "auto", "llama.cpp", record_features=False)
    ids = lcpp.encode_prompt(PROMPTS[2])
    assert generate(bare, ids, NgramDrafter(block_size=8), max_new_tokens=24).tokens == \
        generate(lcpp, ids, None, max_new_tokens=24).tokens
    with pytest.raises(HyflashError, match="record_features=False"):
        bare.prefill(ids, features=True)
