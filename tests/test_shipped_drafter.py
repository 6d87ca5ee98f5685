"""End-to-end checks of the drafter shipped for SmolLM2-135M, alone (no n-gram lookup beside it), in float32:
its drafts never change the text, and the target accepts enough of them that a broken drafter (features read
at the wrong position, a wrong head, untrained weights) could not pass."""

from __future__ import annotations

import pytest

from hyflash.decoding import generate

# Measured 2026-12-03 on these three prompts: the shipped drafter (experiments/drafter-copy-n16: copy input of
# matches up to 16 tokens and a copy gate), tau 5.73 / 4.20 / 2.52 (mean 4.15); the first copy drafter 3.71 /
# 4.50 / 2.52 (mean 3.58); the drafter before any copy input 1.85 / 3.94 / 2.25 (mean 2.68); an untrained one of
# the same shape 1.0 on each. So a drafter that lost its copy input fails too.
TAU_FLOOR = 2.9


@pytest.fixture(scope="module")
def chat_prompts(smollm2_fp32):
    from hyflash.bench.datasets import load_set

    return [p.ids for p in load_set("chat", smollm2_fp32, 3, 64)]


def _mean_tau(target, prompts, drafter) -> float:
    taus = []
    for ids in prompts:
        plain = generate(target, ids, None, max_new_tokens=64)
        spec = generate(target, ids, drafter, max_new_tokens=64)
        assert spec.tokens == plain.tokens
        taus.append(spec.tau)
    return sum(taus) / len(taus)


@pytest.mark.slow
def test_shipped_drafter_is_lossless_and_accepted(smollm2_fp32, chat_prompts, tmp_path):
    from hyflash.drafters.loading import read_config
    from hyflash.drafters.model import DrafterModel
    from hyflash.drafters.registry import load_drafter, shipped_drafter_path

    path = shipped_drafter_path("smollm2-135m")
    shipped = _mean_tau(smollm2_fp32, chat_prompts, load_drafter(path, smollm2_fp32))
    assert shipped >= TAU_FLOOR, f"shipped drafter tau {shipped:.2f} on held-out chat prompts"
    # The floor tells a trained drafter from an untrained one of the same shape.
    DrafterModel(read_config(path), smollm2_fp32).save_pretrained(tmp_path / "untrained")
    untrained = _mean_tau(smollm2_fp32, chat_prompts[:1], load_drafter(tmp_path / "untrained", smollm2_fp32))
    assert untrained < TAU_FLOOR <= shipped
