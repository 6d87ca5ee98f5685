"""Draft trees: many candidate continuations verified in one target pass.

A block drafter gives a distribution for every slot in one pass; a chain uses only the top token of each.
`build_tree` grows a tree best-first by path probability (the product of the slot probabilities along the
path) under a node budget, from the drafter's per-slot top tokens, and merges extra candidate chains (the
n-gram lookup's) into it. The target scores root + nodes in one pass, each node attending to the cached
context, the root and its own ancestors only (`ancestor_mask`), at position base + depth.

Verification walks down from the root:
  greedy   follow the child whose token is the target's argmax at the current node;
  sampling recursive rejection over the children in order, each a deterministic (one-hot) draft: accept
           child c with probability r(c) under the residual r (initially the target's p), else zero r(c),
           renormalise and try the next; if every child is rejected, sample from r. The emitted token at
           each node is then distributed exactly as p (the tree is a function of the drafter's distributions,
           never of sampled tokens), so the output distribution is the target's.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from hyflash.sampling import argmax, sample


@dataclass
class DraftTree:
    tokens: list[int]  # node i's token (nodes in insertion order; a parent always precedes its children)
    parents: list[int]  # node i's parent, -1 = the root (the verified token the target has not run yet)
    depths: list[int]  # 1 for the root's children
    source: str = "drafter"  # the block drafter it grew from (calibration)
    confidence: torch.Tensor | None = None  # that drafter's per-slot confidence

    def confidence_or_default(self) -> torch.Tensor:
        return self.confidence if self.confidence is not None else torch.full((max(self.depths, default=0),), 0.5)

    def __len__(self) -> int:
        return len(self.tokens)

    def first(self, n: int) -> "DraftTree":
        """The first n nodes: still a tree (parents precede children), the n best when grown best-first."""
        if n >= len(self):
            return self
        return DraftTree(self.tokens[:n], self.parents[:n], self.depths[:n], self.source, self.confidence)

    def children(self, node: int) -> list[int]:
        """Children of node (-1 = root) in insertion order: the more probable first."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def path(self, node: int) -> list[int]:
        out = []
        while node != -1:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def ancestor_mask(self) -> torch.Tensor:
        """[n+1, n+1] bool over (root, nodes): row i may attend to column j (itself, its ancestors, root)."""
        n = len(self)
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        mask[:, 0] = True
        for i in range(n):
            for j in self.path(i):
                mask[i + 1, j + 1] = True
        return mask

    def position_offsets(self) -> torch.Tensor:
        """[n+1] offsets from the root's position: 0 for the root, depth for a node."""
        return torch.tensor([0] + self.depths, dtype=torch.long)


def build_tree(slot_probs: torch.Tensor, budget: int, token_ids: torch.Tensor | None = None,
               chains: list[list[int]] = (), width: int = 8) -> DraftTree:
    """Best-first tree of at most `budget` nodes from per-slot distributions [k, V'] (V' may be a reduced
    draft vocabulary; token_ids maps its indices to target ids). Extra `chains` (candidate token lists from
    another drafter) are merged in first, sharing prefixes; they count against the budget."""
    tree = DraftTree([], [], [])
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node

    def add(parent: int, token: int) -> int:
        key = (parent, token)
        if key not in index:
            index[key] = len(tree)
            tree.tokens.append(token)
            tree.parents.append(parent)
            tree.depths.append(1 if parent == -1 else tree.depths[parent] + 1)
        return index[key]

    for chain in chains:
        parent = -1
        for token in chain[: slot_probs.shape[0]]:
            if len(tree) >= budget and (parent, int(token)) not in index:
                break
            parent = add(parent, int(token))
    k = slot_probs.shape[0]
    if k == 0 or budget <= len(tree):
        return tree
    top_p, top_i = slot_probs.topk(min(width, slot_probs.shape[-1]), dim=-1)  # [k, w]
    ids = top_i if token_ids is None else token_ids.to(top_i.device)[top_i]
    top_p, ids = top_p.tolist(), ids.tolist()
    # Heap of candidates (-path probability, tiebreak, parent node, parent path prob, slot, rank).
    heap = [(-top_p[0][0], 0, -1, 1.0, 0, 0)]
    tick = 1
    while heap and len(tree) < budget:
        neg, _, parent, parent_p, slot, rank = heapq.heappop(heap)
        node = add(parent, ids[slot][rank])
        if rank + 1 < len(ids[slot]):  # the next-best sibling
            heapq.heappush(heap, (-parent_p * top_p[slot][rank + 1], tick, parent, parent_p, slot, rank + 1))
            tick += 1
        if slot + 1 < k:  # the best child
            heapq.heappush(heap, (neg * top_p[slot + 1][0], tick, node, -neg, slot + 1, 0))
            tick += 1
    return tree


def verify_tree(tree: DraftTree, target_probs: torch.Tensor, greedy: bool,
                generator: torch.Generator | None) -> tuple[list[int], int]:
    """target_probs [n+1, V] at (root, nodes): warped distributions, or under greedy anything whose argmax is the
    target's choice (its raw logits). Returns (accepted node indices along one path, next token)."""
    path: list[int] = []
    node = -1
    while True:
        p = target_probs[node + 1]
        kids = tree.children(node)
        if greedy:
            best = int(argmax(p))
            nxt = next((c for c in kids if tree.tokens[c] == best), None)
            if nxt is None:
                return path, best
            path.append(nxt)
            node = nxt
            continue
        residual = p.clone()
        chosen = None
        for c in kids:
            total = residual.sum()
            if total <= 0:
                break
            u = torch.rand((), generator=generator, device=p.device)
            if u * total < residual[tree.tokens[c]]:
                chosen = c
                break
            residual[tree.tokens[c]] = 0.0
        if chosen is None:
            total = residual.sum()
            r = residual / total if total > 0 else p
            return path, int(sample(r, generator))
        path.append(chosen)
        node = chosen
