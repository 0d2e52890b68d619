"""Drafters' tree proposals: scored candidate trees from the n-gram index
and from a draft model's or an MTP head's top-k, for `TreeShape.select` to cut.

Contract: each `*_candidates` function (and a drafter's `propose_tree`
over `top_k_chain`) returns a TreeDraft whose candidate scores fall
from parent to child (shares of n-gram matches, or products of draft
probabilities), whose first branch is what the drafter's chain `propose`
would have said (so a tree never verifies less than the chain), and which
says which of its tokens the drafter's own cache now holds.

Under sampling (the drafter's sampler is not greedy) a model drafter draws
instead of ranking (`drawn_chain`): each chain node's children are drawn
from its own q without replacement, the first of them continues the chain,
and the tree records q and the draw order per node (TokenTree.drawn) for
recursive rejection sampling (trees/verify.py). Its scores and its node
count are fixed before anything is drawn (see `drawn_chain`), which is what
keeps that verification exact whatever shape or budget cuts the tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from specpipe.trees.tree import Drawn, TokenTree

if TYPE_CHECKING:
    from specpipe.drafters.model import ModelDrafter

MAX_MATCHES = 64  # earlier n-gram matches read per step


@dataclass
class TreeDraft:
    candidates: TokenTree
    cached_tail: list[int] = field(default_factory=list)  # drafted tokens fed into the drafter's cache, in order
    catchup_tokens: int = 0  # context tokens fed before drafting (model drafters)
    source: str = ""  # draft=chain: the source that drafted the tree (its Drafted event names it)


def ngram_candidates(ids: np.ndarray, min_n: int, max_n: int, depth: int) -> TreeDraft:
    """A trie of what followed earlier matches of the context's last n ids.

    Every earlier match (longest n first, most recent first) adds its
    continuation of up to `depth` ids with weight n; the chain's own
    proposal (the most recent match of the longest n) outweighs all others.
    A node's score is the weight of the matches through it over the total.

    Example: ids [1, 2, 9, 1, 2, 7, 1, 2], n = 2, depth 1: matches at 0 and 3
    -> children 7 (chain's, most recent) and 9 of the root.
    """
    trie: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    tree, weights, total = TokenTree(), [], 0.0
    seen: set[int] = set()
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        suffix = ids[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
        for start in np.flatnonzero((windows == suffix).all(axis=1))[::-1]:
            cont = ids[start + n : start + n + depth]
            if start + n in seen or len(cont) == 0:
                continue  # the same continuation already came from a longer match
            seen.add(start + n)
            w = 1000.0 if total == 0 else float(n)
            total += w
            parent = -1
            for tok in cont.tolist():
                node = trie.get((parent, tok))
                if node is None:
                    node = trie[(parent, tok)] = len(tree.tokens)
                    tree.tokens.append(tok)
                    tree.parents.append(parent)
                    weights.append(0.0)
                weights[node] += w
                parent = node
            if len(seen) >= MAX_MATCHES:
                break
        if len(seen) >= MAX_MATCHES:
            break
    tree.scores = [w / total for w in weights]
    return TreeDraft(candidates=tree)


def model_candidates(drafter: ModelDrafter, context_ids: list[int], depth: int, width: int) -> TreeDraft:
    """A greedy chain of `depth` draft tokens, each with its `width - 1` best siblings as leaves
    (drawn from q instead when the drafter's sampler samples: `drawn_chain`).

    Scores are products of draft probabilities along the path. The chain
    costs the same forwards as `propose(context, depth)`; siblings are free
    (read from the same logits). The draft cache ends holding the context
    and the chain's first depth - 1 tokens, as after `propose`.
    """
    drafter.take_in(context_ids)
    capture = drafter.rollback_capture()  # the drafter rolls its own cache back afterwards, as after propose
    start = drafter.cached_len
    fed = len(context_ids) - start
    catchup = fed - 1

    def next_logits(i: int, y):
        nonlocal fed
        # the first forward feeds what the draft cache has not seen (at least the newest token), later ones y
        ids = mx.array(context_ids[start:], dtype=mx.uint32) if i == 0 else y
        fed += i > 0
        drafter.forwards += 1
        return drafter.draft_logits(ids, capture)

    tree, chain = top_k_chain(next_logits, depth, width, drafter.sampler)
    drafter.note_fed(context_ids, start, chain[:-1], fed)
    return TreeDraft(candidates=tree, cached_tail=chain[:-1], catchup_tokens=catchup)


def top_k_chain(next_logits: Callable, depth: int, width: int, sampler=None) -> tuple[TokenTree, list[int]]:
    """Chain `depth` greedy steps of a model drafter (draft model or MTP head), keeping each depth's
    `width - 1` next best tokens as leaves beside the chain's token. A sampler that samples (not
    greedy) draws the chain and its siblings from q instead (`drawn_chain`).

    Worked example (width 2, depth 2): depth 0's top two are a 0.6, b 0.3; after a, depth 1's are
    c 0.5, d 0.2 -> nodes a 0.6, b 0.3 (root's children), c 0.3, d 0.12 (a's); chain [a, c].

    Args:
        next_logits: (i, the chain's token at depth i - 1 as [1] uint32, None for i = 0) -> [1, vocab]
            float32 logits at depth i, as drafters/chain.py asks; it feeds the drafter's cache.
        depth: chain steps (next_logits calls).
        width: tokens per depth (the chain's and its siblings).
        sampler: the drafter's specpipe.core.sampling.Sampler; None or greedy: the top-k chain below.

    Returns:
        (tree, chain): scores are products of probabilities along the path, parents first; `chain`
        holds the greedy tokens, the tree's first branch (what `propose(context, depth)` drafts greedily).
    """
    if sampler is not None and not sampler.greedy:
        return drawn_chain(next_logits, depth, width, sampler)
    tops, probs = [], []
    y = None
    for i in range(depth):
        p = mx.softmax(next_logits(i, y)[-1], axis=-1)  # [vocab]
        # the `width` best, best first (top[0] is the argmax: the chain's token); a partition, not a sort of
        # the whole vocabulary: 2 vs 18 ms per depth over Qwen's 152k ids on this CPU
        part = mx.argpartition(-p, kth=width - 1)[:width] if width < p.shape[-1] else mx.arange(p.shape[-1])
        top = part[mx.argsort(-p[part])]
        tops.append(top)
        probs.append(p[top])
        y = top[:1].astype(mx.uint32)
    mx.eval(tops, probs)  # one host round trip for the whole chain
    tree, parent, path_p = TokenTree(), -1, 1.0
    chain = []
    for top, p in zip(tops, probs):
        nodes = [tree.add(int(t), parent, path_p * float(q)) for t, q in zip(top.tolist(), p.tolist())]
        path_p *= float(p[0].item())
        parent = nodes[0]
        chain.append(int(top[0].item()))
    return tree, chain


def drawn_chain(next_logits: Callable, depth: int, width: int, sampler) -> tuple[TokenTree, list[int]]:
    """A chain of `depth` tokens each drawn from the drafter's q, with siblings drawn from the same q
    without replacement: the tree a sampled run verifies by recursive rejection sampling (trees/verify.py).

    At each chain node one Gumbel-top-k draw (the order of log q + Gumbel noise is the order of
    sequential draws without replacement from q) gives the node's children in draw order; the first
    continues the chain, so the first branch is distributed as the sampled chain `propose` drafts.

    The layout is fixed before anything is drawn, which exactness needs (verify.py's docstring): every
    depth has `slots` children, slots = how many of the root's `width` most likely tokens have q > 0; the
    chain's node scores 1.0 and the j-th sibling the root's j-th largest probability r_j, at every depth
    (ties: shallower first). So a shape, a budget cut or the auto sizer, which read scores and depths,
    never choose by what was drawn. A node whose q holds fewer than `slots` tokens fills the rest with
    the draft's best other raw logits, verified as point masses (exact for any token). For a drafter as
    good as the target every draw is accepted, so the chain comes first, as the chain drafter's draft.

    Worked example (width 3, depth 2): the root's q has r = [0.5, 0.3, 0.2]; draws a, b, c at the root,
    then d, e, f after a -> nodes a 1.0, b 0.3, c 0.2 (the root's), d 1.0, e 0.3, f 0.2 (a's); chain [a, d].

    Args:
        next_logits: as for `top_k_chain`.
        depth: chain steps (next_logits calls).
        width: at most this many children per chain node.
        sampler: the drafter's sampler: q = sampler.probs(logits), noise from sampler.key().

    Returns:
        (tree, chain): tree.drawn holds each chain node's q and draw order (keyed by token path).
    """
    qs, draws, best = [], [], []
    y = None
    for i in range(depth):
        logits = next_logits(i, y)[-1]  # [vocab]
        q = sampler.probs(logits[None])[0]
        keys = mx.log(q) + mx.random.gumbel(q.shape, key=sampler.key())  # -inf where q = 0: never drawn
        drawn = _top(keys, width)
        qs.append(q)
        draws.append(drawn)
        best.append(_top(logits, width))  # the fill where q holds fewer than `width` tokens
        y = drawn[:1].astype(mx.uint32)
    mx.eval(qs, draws, best)  # one host round trip for the whole chain
    q_rows = [np.array(q) for q in qs]
    root = q_rows[0] if q_rows else np.zeros(0)
    ranks = -np.sort(-np.partition(root, -width)[-width:]) if width < len(root) else -np.sort(-root)
    slots = int(np.count_nonzero(ranks > 0))
    scores = [1.0] + [float(r) for r in ranks[1:slots]]
    tree, parent, path, chain = TokenTree(), -1, tuple[int, ...](), list[int]()
    for q, drawn, top in zip(q_rows, draws, best):
        order = [t for t in drawn.tolist() if q[t] > 0][:slots]
        fill = [t for t in top.tolist() if t not in order][: slots - len(order)]
        tree.drawn[path] = Drawn(q=q, order=order)
        nodes = [tree.add(t, parent, sc) for t, sc in zip(order + fill, scores)]
        parent, path = nodes[0], path + (order[0],)
        chain.append(order[0])
    return tree, chain


def _top(values: mx.array, n: int) -> mx.array:
    """The indices of the `n` largest of [vocab] `values`, largest first (a partition, not a full sort)."""
    if n >= values.shape[-1]:
        return mx.argsort(-values)
    part = mx.argpartition(-values, kth=n - 1)[:n]
    return part[mx.argsort(-values[part])]
