"""A long prompt is taken in piece by piece (issue 39, item 7): the drafter never fuses, projects or folds more
than INGEST_SLICE positions at once, which kept a 7.5k-token prompt's peak RSS with the default drafter near
plain decoding's (experiments/rss/peak_rss.py measures it), and the pieces give the state one piece gives."""

from __future__ import annotations

import torch

from hyflash.drafters import state as state_module
from hyflash.drafters.config import DrafterConfig
from hyflash.drafters.model import DrafterModel
from hyflash.drafters.state import DrafterState
from hyflash.sampling import SamplingConfig


def _drafter(target, **overrides) -> DrafterState:
    torch.manual_seed(0)
    config = DrafterConfig.for_target(target, kind="hyflash", window=16, chunk_size=4, num_heads=2, head_dim=8,
                                      **overrides)
    return DrafterState(DrafterModel(config, target).float())


def test_a_long_ingest_is_taken_in_slices_and_equals_short_pieces(llama_target, monkeypatch):
    monkeypatch.setattr(state_module, "INGEST_SLICE", 32, raising=False)  # (raising: absent before the fix)
    n = 3 * 32 + 7
    tokens = torch.randint(0, llama_target.vocab_size, (n,), generator=torch.Generator().manual_seed(0))
    features = torch.randn(n, len(llama_target.feature_layers), llama_target.hidden_size)
    whole, pieces = _drafter(llama_target), _drafter(llama_target)
    fused_rows: list[int] = []
    whole.model.fusion.register_forward_hook(lambda module, args, out: fused_rows.append(args[0].shape[0]))
    whole.ingest(tokens, features)
    assert fused_rows == [32, 32, 32, 7]  # never the whole prompt at once
    for i in range(0, n, 5):  # as the decoding loop feeds it: a few verified tokens at a time
        pieces.ingest(tokens[i : i + 5], features[i : i + 5])
    assert (whole.length, whole.start) == (pieces.length, pieces.start) == (n, whole.config.memory_start(n))
    for a, b in zip(whole.held_tensors(), pieces.held_tensors()):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    draft = [d.draft(int(tokens[-1]), 3, SamplingConfig(), None).tokens for d in (whole, pieces)]
    assert torch.equal(*draft)


def test_prefill_copies_each_chunks_features_into_one_tensor(llama_target, monkeypatch):
    """The prompt's features exist once: no concatenation of the chunks' features (which held them twice at the
    end of a long prefill), and the result is what one pass gives."""
    prompt = torch.randint(0, 90, (23,), generator=torch.Generator().manual_seed(1))
    whole = llama_target.prefill(prompt, chunk=1000).features
    shape = (len(prompt), len(llama_target.feature_layers), llama_target.hidden_size)
    made: list[tuple[int, ...]] = []
    cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda *a, **k: (out := cat(*a, **k), made.append(tuple(out.shape)))[0])
    chunked = llama_target.prefill(prompt, chunk=5).features
    assert made and shape not in made  # the cache's concatenations are seen, the prompt's features are not among them
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)


def test_the_prompts_features_are_freed_once_the_drafter_has_them(llama_target):
    """The decoding loop does not hold the prompt's features through the generation (86 MB at 7.5k positions)."""
    import gc
    import weakref

    from drafters_for_tests import RandomBlockDrafter

    from hyflash.decoding import generate

    class Watching(RandomBlockDrafter):
        prompt_features = None

        def ingest(self, tokens, features):
            if self.prompt_features is None:
                self.prompt_features = weakref.ref(features)
            super().ingest(tokens, features)

        def propose(self, *args, **kwargs):
            gc.collect()
            self.alive_while_drafting.append(self.prompt_features() is not None)
            return super().propose(*args, **kwargs)

    drafter = Watching(llama_target.vocab_size, 4, seed=0)
    drafter.alive_while_drafting = []
    generate(llama_target, list(range(3, 40)), drafter, max_new_tokens=6)
    assert drafter.alive_while_drafting and not any(drafter.alive_while_drafting)


def test_the_drafter_takes_the_prompt_in_as_the_prefill_runs_it(llama_target, monkeypatch):
    """The decoding loop hands each prefill chunk's features to the drafter as the chunk is run, so the prompt's
    features are never all held at once (at 7.5k SmolLM2 positions in fp32 they were 86 MB of the peak); the
    pieces are the prompt's tokens and features, in order."""
    from drafters_for_tests import RandomBlockDrafter

    from hyflash.decoding import generate

    prompt = torch.arange(3, 40)
    whole = llama_target.prefill(prompt).features
    events: list[str] = []
    prefill, forward = llama_target.prefill, llama_target._forward
    monkeypatch.setattr(llama_target, "prefill", lambda *a, **k: prefill(*a, chunk=8, **k))
    monkeypatch.setattr(llama_target, "_forward", lambda *a, **k: (events.append("pass"), forward(*a, **k))[1])

    class Recording(RandomBlockDrafter):
        def ingest(self, tokens, features):
            if sum(len(t) for t, _ in pieces) < len(prompt):
                pieces.append((tokens.clone(), features.clone()))
                events.append("ingest")
            super().ingest(tokens, features)

    pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
    generate(llama_target, prompt.tolist(), Recording(llama_target.vocab_size, 4, seed=0), max_new_tokens=3)
    assert events[:10] == ["pass", "ingest"] * 5  # 37 tokens in chunks of 8, each ingested before the next runs
    assert [len(t) for t, _ in pieces] == [8, 8, 8, 8, 5]
    assert torch.equal(torch.cat([t for t, _ in pieces]), prompt)
    torch.testing.assert_close(torch.cat([f for _, f in pieces]), whole, atol=1e-5, rtol=1e-5)


def test_prefill_maps_large_blocks_and_gives_the_heap_back_after(llama_target, monkeypatch):
    """The chunked prefill's growing key/value blocks are served by memory maps (freed blocks go back to the
    system instead of staying resident as heap holes); decoding afterwards gets heap blocks again."""
    from hyflash.targets import hf

    calls, seen_by_forward = [], []
    monkeypatch.setattr(hf, "_glibc_mallopt", lambda: lambda param, value: calls.append((param, value)) or 1)
    forward = llama_target._forward
    monkeypatch.setattr(llama_target, "_forward", lambda *a, **k: (seen_by_forward.append(list(calls)), forward(*a, **k))[1])
    llama_target.prefill(torch.arange(3, 30), chunk=10)
    # After it: heap blocks again, and the heap keeps freed memory for the next step (not trimmed at 128 KiB)
    assert calls == [(hf.M_MMAP_THRESHOLD, 1 << 20), (hf.M_MMAP_THRESHOLD, hf.HEAP_BLOCKS_UP_TO),
                     (hf.M_TRIM_THRESHOLD, hf.HEAP_KEPT_FREE)]
    assert seen_by_forward == [[(hf.M_MMAP_THRESHOLD, 1 << 20)]] * 3  # every chunk runs with large blocks mapped
    llama_target.score(torch.tensor([5]))
    assert len(calls) == 3  # a decode step leaves the allocator alone


def test_glibcs_mallopt_is_found_and_accepts_the_setting():
    import platform

    import pytest

    from hyflash.targets import hf

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only: elsewhere large_blocks_mapped is a no-op")
    mallopt = hf._glibc_mallopt()
    assert mallopt is not None and mallopt(hf.M_MMAP_THRESHOLD, hf.HEAP_BLOCKS_UP_TO) == 1
