"""Comparison on a token tree: the accepted root-to-leaf path and the target's token after it.

Contract: the rules a comparator plug-in (core/stages/compare.py, `Comparator.compare_tree`) settles a
tree by. `compare_tree(tree, logits, sampler, draft)`: greedy (`pick_path`, the path of the target's
argmaxes) when the run is greedy, else recursive rejection sampling (`pick_path_sampled`, compare=rejection)
with each node's children verified as drawn from the drafter's q where the drafter drew them
(`draft.candidates.drawn`, trees/drafting.drawn_chain) and as point masses otherwise (n-gram, lookahead).
`match_tree` is compare=match's rule (mlx-lm's): sample the target at each node of the path, follow the
child holding that token. Greedy is lossless by construction: every accepted token is the argmax after its
own path, which is what decoding without a draft emits. Both sampling rules are exact: the emitted tokens
follow the target's distribution (below; for match, each emitted token is a draw of p after its path).
Nothing here runs a model.

Greedy worked example: tree tokens [5, 7, 9], parents [-1, 0, 0]; argmax per row [5, 9, 1, 8]: the
root's argmax 5 is node 0, node 0's argmax 9 is node 2, node 2 (row 3) has no children -> path [0, 2],
next token 8 (a bonus).

Sampling: recursive rejection sampling (SpecInfer, Miao et al. 2023; SpecTr, Sun et al. 2023; without
replacement, Jeon et al. 2024, "Recursive Speculative Decoding"). At a node whose target distribution
is p, its children are tried as stages i = 1, 2, ...; stage i proposes x_i from a distribution q_i:
    accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), p_1 = p;
    on rejection p_{i+1} = norm((p_i - q_i)+) and the next child is tried;
    after the last stage (or at a leaf) the token is drawn from what is left, p_{m+1}.
- A drawn child (a model drafter under sampling): q_1 = q, the drafter's distribution at the node,
  and q_{i+1} = q_i with x_i removed and renormalised. The children were drawn from q without
  replacement in this order, so x_i is exactly a draw from q_i given x_1 .. x_{i-1}.
- A point-mass child (a drafter without a distribution): q_i = onehot(x_i), so it is accepted with
  probability p_i(x_i) and the residual is p_i without x_i, renormalised.

Why the token leaving a node is distributed as p. One stage with x_i ~ q_i, followed by anything that
emits p_{i+1} after a rejection, emits y with probability
    q_i(y) min(1, p_i(y) / q_i(y)) + P(reject) p_{i+1}(y)
        = min(p_i, q_i)(y) + (1 - sum min(p_i, q_i)) (p_i - q_i)+(y) / sum (p_i - q_i)+ = p_i(y),
since sum (p_i - q_i)+ = 1 - sum min(p_i, q_i) and min(a, b) + (a - b)+ = a. The last stage is followed
by a draw from p_{m+1} itself, so by induction backwards every stage emits its p_i and the node emits
p_1 = p. This holds conditionally on x_1 .. x_{i-1}, so q_{i+1} may depend on them: that is what lets the
next proposal drop x_i, and it loses nothing, because x_i is rejected only where p_i(x_i) < q_i(x_i),
and there p_{i+1}(x_i) = 0. A point mass is the same identity with q_i = onehot(x_i), for any x_i. The
accepted child then starts the same process at its own node, against the target's p after the path,
with fresh coins; so the emitted sequence follows the target's own sampling token by token.

Example (point masses): p = [0.5, 0.3, 0.2], children tokens 1 then 0: accept 1 with 0.3; else
p -> [5/7, 0, 2/7], accept 0 with 5/7; else sample 2. Drawn: the same p, q = [0.6, 0.4, 0], two
children. Drawn 0 then 1 (probability 0.6): accept 0 with min(1, 0.5/0.6) = 5/6; else p -> norm((p -
q)+) = [0, 0, 1] and q -> [0, 1, 0]: 1 is accepted with 0, 2 is emitted. Drawn 1 then 0 (0.4): accept 1
with 3/4; else p -> [0, 0, 1], emit 2. P(0) = 0.6 * 5/6 = 0.5, P(1) = 0.4 * 3/4 = 0.3, P(2) = 0.2: p.

What exactness asks of the tree. A drawn stage's token must be a draw from q_i given that the stage
exists, so whatever chooses the verified nodes (the shape, a budget cut, the auto sizer) must not
choose by what was drawn at or below them: drafting.drawn_chain fixes every node's score and the
node count before drawing, and those choosers read only scores and depths. The kept drawn children of
a node must be a prefix of the draw order; a child after a gap is verified as a point mass instead
(exact for any token). Broken variants the tests catch: recovering from p instead of (p - q)+, or
keeping q whole after a sibling was removed (tests/test_tree_sampling.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from specpipe.trees.tree import Drawn, TokenTree


@dataclass
class TreeVerdict:
    path: list[int]  # accepted node indices, root's child first
    next_id: int  # the target's token after the path
    bonus: bool  # True when the path ends at a leaf (nothing drafted was rejected there)


def compare_tree(tree: TokenTree, logits: mx.array, sampler, draft=None, argmax_ids=None) -> TreeVerdict:
    """The accepted path of a verified tree: greedy, or recursive rejection sampling.

    Args:
        tree: the verified nodes, as fed after the root.
        logits: [n + 1, vocab] the target's logits per fed row (row 0: the root, node i at row i + 1).
        sampler: the run's specpipe.core.sampling.Sampler; None or greedy: argmax comparison.
        draft: the TreeDraft the tree was cut from; its candidates' `drawn` says which children were drawn
            from the drafter's q (None, or nothing drawn: every child is a point mass).
        argmax_ids: [n + 1] the target's argmax per row, when the caller has them already (greedy only).
    """
    if sampler is None or sampler.greedy:
        return pick_path(tree, argmax_ids if argmax_ids is not None else mx.argmax(logits, axis=-1).tolist())
    probs = sampler.probs(logits)  # [n + 1, vocab], processed as the drafter's q and the chain's comparator
    return pick_path_sampled(
        tree,
        target_probs=lambda row: np.array(probs[row], dtype=np.float64),
        uniform=lambda: mx.random.uniform(key=sampler.key()).item(),
        sample=lambda p: int(sampler.sample(mx.array(p, dtype=mx.float32)[None]).item()),
        drawn=draft.candidates.drawn if draft is not None else None,
    )


def match_tree(tree: TokenTree, logits: mx.array, sampler) -> TreeVerdict:
    """compare=match on a tree: at each node of the path sample y ~ p (the target's processed probabilities
    after the path), follow the child whose token is y, else emit y. Exact for any tree and any drafter
    (every emitted token is a draw of p), and accepts a child x with p(x), never the min(1, p(x) / q(x)) of
    rejection sampling: lower acceptance, as for a chain.

    Args:
        tree: the verified nodes (children unique per parent).
        logits: [n + 1, vocab] the target's logits per fed row (row 0: the root, node i at row i + 1).
        sampler: the run's specpipe.core.sampling.Sampler (its key stream draws y).
    """
    probs = sampler.probs(logits)  # [n + 1, vocab]
    return pick_path(tree, lambda row: int(sampler.sample(probs[row : row + 1]).item()))


def pick_path(tree: TokenTree, argmax_ids: list[int] | Callable[[int], int]) -> TreeVerdict:
    """The accepted path.

    Args:
        tree: the verified nodes (children unique per parent: TokenTree.add deduplicates).
        argmax_ids: [n + 1] the target's argmax per fed row, or row -> the target's token there (match_tree's
            draws, asked only along the path).
    """
    children: dict[int, dict[int, int]] = {}
    for i, (tok, parent) in enumerate(zip(tree.tokens, tree.parents)):
        children.setdefault(parent, {})[tok] = i
    token_at = argmax_ids if callable(argmax_ids) else argmax_ids.__getitem__
    node, path = -1, list[int]()
    while True:
        want = token_at(node + 1)
        nxt = children.get(node, {}).get(want)
        if nxt is None:
            return TreeVerdict(path=path, next_id=want, bonus=node not in children)
        path.append(nxt)
        node = nxt


def pick_path_sampled(
    tree: TokenTree,
    target_probs: Callable[[int], np.ndarray],
    uniform: Callable[[], float],
    sample: Callable[[np.ndarray], int],
    residual: Callable[[np.ndarray, int], np.ndarray] | None = None,
    drawn: Mapping[tuple[int, ...], Drawn] | None = None,
) -> TreeVerdict:
    """Recursive rejection sampling down the tree: the output is distributed exactly as the target samples.

    Args:
        target_probs: row -> [vocab] processed target probabilities (row 0 the root, node i at i + 1).
        uniform: a draw from U[0, 1) (the sampler's key stream).
        sample: a token drawn from a [vocab] distribution.
        residual: (p, rejected point-mass token) -> next p; the correct rule unless a test swaps in a broken one.
        drawn: token path -> how that node's children were drawn (TokenTree.drawn); None: all point masses.
    """
    residual = residual or _without
    drawn = drawn or {}
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(i)
    node, path, key = -1, list[int](), tuple[int, ...]()
    while True:
        p = target_probs(node + 1)
        kids = children.get(node, [])
        chosen = None
        for kid, q in _stages(tree, kids, drawn.get(key)):
            tok = tree.tokens[kid]
            if q is None:  # a point mass: accepted with p(x)
                if uniform() < p[tok]:
                    chosen = kid
                    break
                p = residual(p, tok)
            else:  # drawn from q: accepted with min(1, p(x) / q(x)) (q(x) > 0: it was drawn)
                if uniform() < min(1.0, p[tok] / q[tok]):
                    chosen = kid
                    break
                p = _residual(p, q)
        if chosen is None:
            return TreeVerdict(path=path, next_id=sample(p), bonus=not kids)
        path.append(chosen)
        node, key = chosen, key + (tree.tokens[chosen],)


def _stages(tree: TokenTree, kids: list[int], drawn: Drawn | None) -> Iterator[tuple[int, np.ndarray | None]]:
    """A node's children as (node, q_i) stages: drawn ones in draw order with their proposal q_i while they
    form a prefix of it, then the rest as point masses (q None), best-scored first.

    Lazy: q_{i+1} (q_i without x_i) is computed only when stage i was rejected.
    """
    used: set[int] = set()
    if drawn is not None:
        by_token = {tree.tokens[k]: k for k in kids}
        q = np.asarray(drawn.q, dtype=np.float64)
        q = q / q.sum()
        for tok in drawn.order:
            kid = by_token.get(tok)
            if kid is None or q[tok] <= 0:
                break  # cut from the tree: a later drawn child is no longer a draw from q_i, so a point mass
            yield kid, q
            used.add(kid)
            q = _drop(q, tok)
    for kid in sorted((k for k in kids if k not in used), key=lambda i: -tree.scores[i]):
        yield kid, None


def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm((p - q)+): what is left of p after a drawn child is rejected; p itself where nothing is left
    (p == q, where a rejection has probability 0 and only rounding gets here)."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 1e-12 else p


def _drop(q: np.ndarray, token: int) -> np.ndarray:
    """q with a drawn sibling removed, renormalised: the distribution the next sibling was drawn from."""
    return _without(q, token)


def _without(p: np.ndarray, token: int) -> np.ndarray:
    """p with `token` removed, renormalised (max(0, p - onehot(token)) / Z)."""
    p = p.copy()
    p[token] = 0.0
    total = p.sum()
    return p / total if total > 0 else p
