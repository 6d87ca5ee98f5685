"""Draft trees: best-first construction under a budget, masks, and exact verification (greedy and sampling)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hyflash.tree import DraftTree, build_tree, verify_tree


def _path_prob(tree: DraftTree, probs: torch.Tensor, node: int) -> float:
    return math.prod(float(probs[tree.depths[i] - 1, tree.tokens[i]]) for i in tree.path(node))


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 6), vocab=st.integers(2, 12), budget=st.integers(1, 40), seed=st.integers(0, 10**6))
def test_build_tree_is_best_first_under_the_budget(k, vocab, budget, seed):
    probs = torch.rand(k, vocab, generator=torch.Generator().manual_seed(seed)).softmax(-1)
    tree = build_tree(probs, budget, width=vocab)
    assert len(tree) == min(budget, sum(vocab**d for d in range(1, k + 1)))
    assert all(p < i for i, p in enumerate(tree.parents))  # parents first
    assert len({(p, t) for p, t in zip(tree.parents, tree.tokens)}) == len(tree)  # distinct children
    probs_in_order = [_path_prob(tree, probs, i) for i in range(len(tree))]
    assert all(a >= b - 1e-9 for a, b in zip(probs_in_order, probs_in_order[1:]))  # popped best-first
    if len(tree) < sum(vocab**d for d in range(1, k + 1)):  # nothing left out beats what is in
        inside = min(probs_in_order)
        for depth in range(1, k + 1):
            for seq in itertools.product(range(vocab), repeat=depth):
                p = math.prod(float(probs[d, t]) for d, t in enumerate(seq))
                node, ok = -1, True
                for t in seq:
                    node = next((c for c in tree.children(node) if tree.tokens[c] == t), None)
                    if node is None:
                        ok = False
                        break
                if not ok:
                    assert p <= inside + 1e-9


def test_chains_are_merged_and_count_against_the_budget():
    probs = torch.tensor([[0.1, 0.9], [0.2, 0.8]])
    tree = build_tree(probs, 3, chains=[[0, 0]])
    assert tree.tokens[:2] == [0, 0] and tree.parents[:2] == [-1, 0]
    assert len(tree) == 3 and tree.tokens[2] == 1 and tree.parents[2] == -1  # then the best-first node


def test_ancestor_mask_and_positions():
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[-1, 0, -1, 1], depths=[1, 2, 1, 3])
    mask = tree.ancestor_mask()
    assert mask[4].tolist() == [True, True, True, False, True]  # node 3: root, 0, 1, itself; not its cousin 2
    assert mask[3].tolist() == [True, False, False, True, False]
    assert tree.position_offsets().tolist() == [0, 1, 2, 1, 3]


def test_greedy_verification_follows_the_argmax():
    tree = DraftTree(tokens=[1, 2, 3], parents=[-1, -1, 1], depths=[1, 1, 2])
    probs = torch.eye(4)[[2, 0, 3, 1]]  # root -> 2 (node 1), node 1 -> 3 (node 2), node 2 -> 1
    assert verify_tree(tree, probs, greedy=True, generator=None) == ([1, 2], 1)


# ----- sampling: a Markov "target" over a 4-token vocabulary, trees 3 deep ----------------------------------
V, LENGTH = 4, 3
TABLE = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.1, 0.4, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
DRAFT = torch.tensor([[0.05, 0.15, 0.2, 0.6], [0.6, 0.2, 0.1, 0.1], [0.5, 0.3, 0.1, 0.1]])  # not the target


def _sample_sequence(root: int, generator) -> tuple[int, ...]:
    out: list[int] = []
    while len(out) < LENGTH:
        tree = build_tree(DRAFT, budget=7, width=2)
        last = [root] + [tree.tokens[tree.path(i)[-1]] for i in range(len(tree))]
        probs = TABLE[torch.tensor(last)]  # the target's next-token distribution at root and at every node
        path, nxt = verify_tree(tree, probs, greedy=False, generator=generator)
        out += [tree.tokens[i] for i in path] + [nxt]
        root = out[-1]
    return tuple(out[:LENGTH])


def _chi_square(root: int, runs: int) -> tuple[float, int]:
    g = torch.Generator().manual_seed(0)
    counts: dict = {}
    for _ in range(runs):
        seq = _sample_sequence(root, g)
        counts[seq] = counts.get(seq, 0) + 1
    stat = 0.0
    for seq in itertools.product(range(V), repeat=LENGTH):
        p, prev = 1.0, root
        for t in seq:
            p *= float(TABLE[prev, t])
            prev = t
        stat += (counts.get(seq, 0) - p * runs) ** 2 / (p * runs)
    return stat, V**LENGTH - 1


def _critical(df: int, z: float = 3.09) -> float:
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_tree_sampling_matches_the_target_distribution():
    tree = build_tree(DRAFT, budget=7, width=2)
    assert max(tree.depths) >= 3  # paths at least 3 deep
    stat, df = _chi_square(root=0, runs=4000)
    assert stat < _critical(df), f"chi2 {stat:.1f} on {df} df"


def test_the_tree_test_catches_a_wrong_rule(monkeypatch):
    """Accepting each child with its raw probability p(c), without renormalising the residual after a
    rejected sibling (a plausible bug), must fail the same check."""
    def no_renormalising(tree, target_probs, greedy, generator):
        path, node = [], -1
        while True:
            p = target_probs[node + 1]
            chosen = None
            for c in tree.children(node):
                if torch.rand((), generator=generator) < p[tree.tokens[c]]:
                    chosen = c
                    break
            if chosen is None:
                return path, int(torch.multinomial(p, 1, generator=generator))
            path.append(chosen)
            node = chosen

    monkeypatch.setattr(f"{__name__}.verify_tree", no_renormalising)  # _sample_sequence's binding
    stat, df = _chi_square(root=0, runs=4000)
    assert stat > _critical(df)


@pytest.mark.parametrize("budget", [1, 4, 16])
def test_reduced_vocabulary_ids_map_back(budget):
    probs = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    tree = build_tree(probs, budget, token_ids=torch.tensor([10, 20]))
    assert set(tree.tokens) <= {10, 20} and len(tree) == min(budget, 6)


# ----- the decoding loop with trees ---------------------------------------------------------------------
from drafters_for_tests import RandomBlockDrafter  # noqa: E402
from hypothesis import HealthCheck  # noqa: E402

from hyflash.decoding import generate  # noqa: E402
from hyflash.drafters.hybrid import HybridDrafter  # noqa: E402
from hyflash.drafters.ngram import NgramDrafter  # noqa: E402
from hyflash.policy import PolicyConfig, SpeculationPolicy  # noqa: E402

LOOP = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def curve(costs):
    from hyflash.costs import CostCurve

    return CostCurve("m", "float32", [0], [list(costs)])


@pytest.mark.parametrize("family", ["llama_target", "gemma_target"])
@LOOP
@given(prompt=st.lists(st.integers(0, 89), min_size=1, max_size=20), budget=st.sampled_from([-1, 1, 4, 9]),
       max_new=st.integers(1, 25), seed=st.integers(0, 1000))
def test_greedy_tree_decoding_equals_plain(request, family, prompt, budget, max_new, seed):
    """Random trees (random slot distributions each step, n-gram chains merged in, fixed and automatic
    budgets) on tiny Llama and Gemma-3 (sliding window 8): the text is plain decoding's."""
    target = request.getfixturevalue(family)
    plain = generate(target, prompt, None, max_new_tokens=max_new)
    drafters = [RandomBlockDrafter(target.vocab_size, 6, seed=seed, sharpness=0.5),
                HybridDrafter(RandomBlockDrafter(target.vocab_size, 6, seed=seed), NgramDrafter(6))]
    for drafter in drafters:
        policy = SpeculationPolicy(curve([1, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5]), PolicyConfig(tree=budget))
        out = generate(target, prompt, drafter, max_new_tokens=max_new, policy=policy)
        assert out.tokens == plain.tokens, type(drafter).__name__


def test_tree_accepts_more_than_the_chain_of_the_same_drafter(llama_target):
    """With an oracle-ish drafter whose second choice is often right, a tree commits more per pass.
    The guard is off: it judges by wall-clock time, so its fall-backs would make the pass counts depend on load."""
    prompt = list(range(5, 25))
    chain = generate(llama_target, prompt, RandomBlockDrafter(llama_target.vocab_size, 5, seed=1, sharpness=0.3),
                     max_new_tokens=40, policy=SpeculationPolicy(curve([1.0] * 16), PolicyConfig(guard=False)))
    tree = generate(llama_target, prompt, RandomBlockDrafter(llama_target.vocab_size, 5, seed=1, sharpness=0.3),
                    max_new_tokens=40, policy=SpeculationPolicy(curve([1.0] * 16), PolicyConfig(tree=15, guard=False)))
    assert tree.tokens == chain.tokens
    assert tree.target_passes <= chain.target_passes


def test_tree_sampling_in_the_loop_matches_the_target(small_vocab):
    """Whole-loop chi-square: 5 tokens (the first pass may verify a tree 3 deep), random block drafter, T=1."""
    from test_sampling import _chi_square, _chi_square_critical, _exact_sequence_probs

    from hyflash.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=1.0)
    prompt, length, runs = [1, 4, 2], 5, 3000
    expected = _exact_sequence_probs(small_vocab, prompt, length, sampling)
    drafter = RandomBlockDrafter(small_vocab.vocab_size, 4, seed=3, sharpness=1.0)
    policy = SpeculationPolicy(None, PolicyConfig(tree=7))
    counts, deep = {}, 0
    for seed in range(runs):
        out = generate(small_vocab, prompt, drafter, max_new_tokens=length, sampling=sampling, seed=seed, policy=policy)
        counts[tuple(out.tokens)] = counts.get(tuple(out.tokens), 0) + 1
        deep += len(out.drafted_by_position) >= 3
    stat, df = _chi_square(counts, expected, runs)
    assert deep > runs // 4  # trees 3 deep were verified
    assert stat < _chi_square_critical(df), f"chi2 {stat:.1f} on {df} df"


@pytest.fixture(scope="module")
def small_vocab():
    from conftest import tiny_llama

    from hyflash.targets import HFTarget

    return HFTarget(tiny_llama(seed=3, vocab=6, hidden=16, layers=2), name="tiny-vocab6")


@pytest.mark.parametrize("budget", [15, -1])
def test_trees_stay_within_the_model_context(llama_target, budget):
    """Six positions left of 512: a tree's node count, not only its depth, is capped by the room left, so tree
    decoding returns plain decoding's 6 tokens instead of a block that would run past the context."""
    prompt = [(7 * i) % 89 for i in range(llama_target.max_context - 6)]
    plain = generate(llama_target, prompt, None, max_new_tokens=50)
    policy = SpeculationPolicy(curve([1.0] * 16), PolicyConfig(tree=budget))
    out = generate(llama_target, prompt, RandomBlockDrafter(llama_target.vocab_size, 8, seed=2, sharpness=0.3),
                   max_new_tokens=50, policy=policy)
    assert len(plain.tokens) == 6 and out.tokens == plain.tokens
    assert llama_target.cache_length <= llama_target.max_context
