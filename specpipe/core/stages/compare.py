"""Compare stage: how much of the draft does the target accept?

Contract: `compare(draft, logits)` returns a Verdict: the accepted count n
(a prefix of the draft) and, when n < k, the target's replacement token at
position n (the *recovered* token). Three rules:
- greedy: accept while the draft equals the target's argmax;
- rejection (Leviathan / Chen): accept x with probability min(1, p(x)/q(x)),
  recover from the normalised residual max(0, p - q): the output follows p
  exactly, whatever q is;
- match (mlx-lm's rule): sample y ~ p at every position, accept while y
  equals the draft: also exact, but accepts with Σ p·q instead of Σ min(p, q).
A drafter without probabilities (n-gram) is a point mass q = onehot(x).
A token tree settles through the same plug-in: `compare_tree(tree, logits, draft, argmax_ids)` returns the
accepted path by the same rule (trees/verify.py: the argmax path, recursive rejection sampling, or match).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx

from specpipe.core.protocols import Comparator  # noqa: F401  (the protocol, with the other kinds')
from specpipe.core.stages.draft import Draft
from specpipe.trees.verify import TreeVerdict, compare_tree, match_tree

if TYPE_CHECKING:
    from specpipe.trees.drafting import TreeDraft
    from specpipe.trees.tree import TokenTree


@dataclass
class Verdict:
    accepted: int  # n: draft[:n] is kept
    recovered_id: int | None  # target token at position n when n < k
    overlap: list[float] = field(default_factory=list)  # Σ min(p, q) per draft position (sampling rules)


def first_false(flags: list[bool]) -> int:
    """Index of the first False, or len(flags): [T, T, F, T] -> 2."""
    return next((i for i, ok in enumerate(flags) if not ok), len(flags))


class GreedyComparator:
    """Accept the longest prefix where the draft equals the target's argmax.

    Example: draft [5, 7, 9], target argmax rows [5, 7, 2, 4]
    -> accepted 2, recovered 2 (row 2 disagrees with draft[2] = 9).
    """

    name = "greedy"

    def compare(self, draft: Draft, logits: mx.array) -> Verdict:
        k = len(draft.token_ids)
        if k == 0:
            return Verdict(accepted=0, recovered_id=None)
        target_ids = mx.argmax(logits[:k], axis=-1).tolist()
        n = first_false([t == d for t, d in zip(target_ids, draft.token_ids)])
        return Verdict(accepted=n, recovered_id=target_ids[n] if n < k else None)

    def compare_tree(
        self, tree: TokenTree, logits: mx.array, draft: TreeDraft | None = None, argmax_ids: list[int] | None = None
    ) -> TreeVerdict:
        """The path of the target's argmaxes; `logits`: [n + 1, vocab], `argmax_ids` when the caller has them."""
        return compare_tree(tree, logits, None, draft, argmax_ids)


# ---------------------------------------------------------------- rejection sampling


def draft_distribution(draft: Draft, vocab: int) -> mx.array:
    """q as [k, vocab]: the drafter's probabilities, or point masses on its ids."""
    if draft.probs is not None:
        return draft.probs.astype(mx.float32)
    ids = mx.array(draft.token_ids)
    return (mx.arange(vocab)[None, :] == ids[:, None]).astype(mx.float32)


def target_and_draft(sampler, draft: Draft, logits: mx.array) -> tuple[mx.array, mx.array]:
    """p and q as [k, vocab], both through the same logits processing."""
    p = sampler.probs(logits[: len(draft.token_ids)])
    return p, draft_distribution(draft, p.shape[-1])


def acceptance_probability(p: mx.array, q: mx.array) -> mx.array:
    """min(1, p/q) per token (rows of [.., vocab]); where q = 0 it is never asked."""
    return mx.minimum(1.0, p / mx.maximum(q, 1e-30))


def residual_distribution(p: mx.array, q: mx.array) -> mx.array:
    """Normalised max(0, p - q); falls back to p where the residual is empty (p == q)."""
    r = mx.maximum(p - q, 0.0)
    total = mx.sum(r, axis=-1, keepdims=True)
    return mx.where(total > 1e-12, r / mx.maximum(total, 1e-30), p)


class SampledComparator:
    """What the sampling comparators share: p and q built by the same sampler, and their overlap
    sum(min(p, q)) per position (the acceptance a rejection sampler expects there)."""

    name: str

    def __init__(self, sampler):
        self.sampler = sampler

    def compare(self, draft: Draft, logits: mx.array) -> Verdict:
        if not draft.token_ids:
            return Verdict(accepted=0, recovered_id=None)
        p, q = target_and_draft(self.sampler, draft, logits)
        return self.judge(draft.token_ids, p, q, mx.sum(mx.minimum(p, q), axis=-1).tolist())

    def judge(self, draft_ids: list[int], p: mx.array, q: mx.array, overlap: list[float]) -> Verdict:
        raise NotImplementedError

    def compare_tree(
        self, tree: TokenTree, logits: mx.array, draft: TreeDraft | None = None, argmax_ids: list[int] | None = None
    ) -> TreeVerdict:
        """Recursive rejection sampling down the tree (trees/verify.py); the argmax path at temperature 0."""
        return compare_tree(tree, logits, self.sampler, draft, argmax_ids)


class RejectionComparator(SampledComparator):
    """Leviathan / Chen speculative sampling; lossless for any drafter."""

    name = "rejection"

    def judge(self, draft_ids: list[int], p: mx.array, q: mx.array, overlap: list[float]) -> Verdict:
        k = len(draft_ids)
        rows, ids = mx.arange(k), mx.array(draft_ids)
        accept_prob = acceptance_probability(p[rows, ids], q[rows, ids])  # [k]
        u = mx.random.uniform(shape=(k,), key=self.sampler.key())
        n = first_false((u < accept_prob).tolist())
        recovered = None
        if n < k:
            recovered = int(self.sampler.sample(residual_distribution(p[n : n + 1], q[n : n + 1])).item())
        return Verdict(accepted=n, recovered_id=recovered, overlap=overlap)


class MatchComparator(SampledComparator):
    """mlx-lm's rule: sample the target at each position, accept on equality."""

    name = "match"

    def judge(self, draft_ids: list[int], p: mx.array, q: mx.array, overlap: list[float]) -> Verdict:
        target_ids = self.sampler.sample(p).tolist()
        n = first_false([t == d for t, d in zip(target_ids, draft_ids)])
        return Verdict(accepted=n, recovered_id=target_ids[n] if n < len(draft_ids) else None, overlap=overlap)

    def compare_tree(
        self, tree: TokenTree, logits: mx.array, draft: TreeDraft | None = None, argmax_ids: list[int] | None = None
    ) -> TreeVerdict:
        """The same rule on a tree: sample the target at each node of the path, follow the child holding it."""
        if self.sampler.greedy:
            return compare_tree(tree, logits, None, draft, argmax_ids)
        return match_tree(tree, logits, self.sampler)
