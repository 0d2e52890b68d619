"""`draft=lookahead`: lookahead decoding (Fu et al. 2024) on the token-tree path: no second model.

Contract: `propose_tree(context, shape)` returns candidates from two sources, both made of the
target's own forwards: the n-gram pool (continuations of the root token gathered so far) and
the Jacobi window (the current guess for the next `window` positions, one branch). The tree
step verifies them in its one forward and hands the target's argmax per fed row back through
`observe_tree`, which advances the Jacobi iteration and harvests new n-grams. The window rides
on the verify: it costs `window` of the step's nodes (verify width), which is why it pays only
where T(n)/T(1) is flat. Needs a tree (tree=static|dynamic): on the chain path nothing would
feed it the window's outputs, so session.check_supported refuses tree=chain in one line.

Jacobi iteration, by absolute position: the window guesses g[p] for positions p after the
root (at position P). Feeding them as a chain, the target's argmax after node p predicts
position p + 1; that becomes the next guess there, x(t+1)[p+1] = f(x(t)[<= p]), so a guess
that has converged is exactly what greedy decoding would emit.

N-gram harvest (the paper's 2-D window, kept as the last `ngram - 1` iterations): a guess at
position q and the outputs that follow it diagonally, o(t)[q], o(t+1)[q+1], ..., are each
predicted from the one before. Worked example, ngram 3: iteration t had guess 7 at q = 10
with output 8; iteration t + 1 fed 8 at q + 1 = 11 and the target answered 9 -> pool[7] gets (8, 9).
"""

from __future__ import annotations

import random
from collections import deque

from specpipe.core.plan import StepPlan
from specpipe.core.protocols import DrafterBase
from specpipe.core.stages.draft import Draft
from specpipe.errors import SpecpipeError
from specpipe.trees.tree import TokenTree

WINDOW_WEIGHT = 0.5  # the Jacobi branch against one pool n-gram: a guess that has not yet been checked


class LookaheadDrafter(DrafterBase):
    name = "lookahead"
    needs_tree = True  # the window's outputs come back only from a tree step
    supports_trees = True

    def __init__(self, window: int = 4, ngram: int = 4, pool: int = 4, seed: int = 0):
        if not 1 <= window <= 32:
            raise SpecpipeError(f"draft.window={window} is out of range: guess 1..32 positions ahead (draft.window=4)")
        if not 2 <= ngram <= 16:
            raise SpecpipeError(f"draft.ngram={ngram} is out of range: gather 2..16-grams (draft.ngram=4)")
        if not 1 <= pool <= 64:
            raise SpecpipeError(f"draft.pool={pool} is out of range: keep 1..64 n-grams per token (draft.pool=4)")
        self.window, self.ngram, self.pool_size, self.seed = window, ngram, pool, seed
        self.pool: dict[int, list[tuple[int, ...]]] = {}  # first token -> continuations, newest last
        self._guess: dict[int, int] = {}  # absolute position -> the window's current guess
        self._levels: deque[dict[int, tuple[int, int]]] = deque(maxlen=ngram - 1)  # position -> (guess, output)
        self._fillers: list[int] = []
        self._rng = random.Random(seed)
        self._fed: list[int] = []  # this step's window as fed: guesses for positions root + 1, ...

    def prefill(self, prompt_ids: list[int]) -> None:
        """A new run: an empty pool, a window of prompt tokens (the paper starts from random ones)."""
        self.pool.clear()
        self._guess.clear()
        self._levels.clear()
        self._rng = random.Random(self.seed)
        self._fillers = list(prompt_ids) or [0]

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        """The newest pool n-gram after the last token (the chain path never runs: needs_tree)."""
        conts = self.pool.get(context_ids[-1], [])
        k = plan.k
        return Draft(token_ids=list(conts[-1][:k]) if conts and k > 0 else [])

    def propose_tree(self, context_ids: list[int], shape):
        from specpipe.trees.drafting import TreeDraft  # MLX: not imported by the config checks (preflight)

        root_pos = len(context_ids) - 1
        depth = shape.max_depth
        self._fed = [self._guess_at(root_pos + 1 + j) for j in range(min(self.window, depth))]
        branches: list[tuple[list[int], float]] = [(self._fed, WINDOW_WEIGHT)]
        for age, cont in enumerate(reversed(self.pool.get(context_ids[-1], []))):
            branches.append((list(cont[:depth]), 1.0 / (1 + age)))  # newest first, as n-gram recency
        return TreeDraft(candidates=_trie(branches))

    def observe_tree(self, context_len: int, tree: TokenTree, argmax_ids: list[int], emitted: int) -> None:
        """After a tree step: `argmax_ids` [n + 1] per fed row (root first), the context had
        `context_len` tokens before it and `emitted` tokens were added."""
        root_pos = context_len - 1
        level: dict[int, tuple[int, int]] = {}
        self._guess[root_pos + 1] = argmax_ids[0]
        node = -1
        for j, tok in enumerate(self._fed):
            node = next((i for i in tree.children(node) if tree.tokens[i] == tok), -2)
            if node == -2:
                break  # the sizer cut the window here: the rest was not fed
            pos = root_pos + 1 + j
            out = argmax_ids[node + 1]  # predicts pos + 1
            level[pos] = (tok, out)
            self._guess[pos + 1] = out
        if level:
            self._levels.append(level)
            self._harvest()
        horizon = root_pos + emitted + 1  # the next root's position is root_pos + emitted
        self._guess = {p: t for p, t in self._guess.items() if p > horizon - 1}

    # ---------------------------------------------------------------- helpers

    def _guess_at(self, pos: int) -> int:
        tok = self._guess.get(pos)
        if tok is None:
            tok = self._guess[pos] = self._rng.choice(self._fillers)
        return tok

    def _harvest(self) -> None:
        """N-grams along the diagonals of the kept iterations, into the pool (deduplicated, newest last)."""
        levels = list(self._levels)
        if len(levels) < self.ngram - 1:
            return
        for q, (first, out) in levels[0].items():
            gram, pos = [first, out], q + 1
            for level in levels[1:]:
                if pos not in level:
                    break
                gram.append(level[pos][1])
                pos += 1
            if len(gram) == self.ngram:
                self._add(gram[0], tuple(gram[1:]))

    def _add(self, key: int, cont: tuple[int, ...]) -> None:
        conts = self.pool.setdefault(key, [])
        if cont in conts:
            conts.remove(cont)
        conts.append(cont)
        del conts[: -self.pool_size]


def _trie(branches: list[tuple[list[int], float]]) -> TokenTree:
    """Branches merged on shared prefixes; a node's score is the weight through it over the total."""
    tree, weights, total = TokenTree(), list[float](), sum(w for b, w in branches if b)
    for tokens, w in branches:
        parent = -1
        for tok in tokens:
            node = next((i for i in tree.children(parent) if tree.tokens[i] == tok), None)
            if node is None:
                node = tree.add(tok, parent)
                weights.append(0.0)
            weights[node] += w
            parent = node
    tree.scores = [w / total for w in weights] if total else []
    return tree
