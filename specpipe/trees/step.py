"""One tree step for the pipeline: draft a token tree, verify it in one
target forward, pick the accepted path, compact both caches.

Contract: `TreeStep.run(step, clock, context, last_id, cache, room)` yields
the step's Drafted, Verified and RolledBack events and leaves `new_ids`
(accepted path + the target's next token) and `accepted` for the pipeline,
which emits them as for a chain. Afterwards the target cache holds the
context plus the accepted path (a plain sequence: the pipeline's cache
invariant), and a model drafter's cache holds no token off that path. A
drafter that `needs_hidden` (draft=mtp) is handed the target's hidden
states of the root and the accepted path, as the chain's verify hands them.
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from specpipe.engine.engine import HIDDEN
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted, RolledBack, Verified
from specpipe.trees.budget import TreeSizer
from specpipe.trees.drafting import TreeDraft
from specpipe.trees.forward import keep_path, tree_forward, tree_refusal
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree
from specpipe.trees.verify import pick_path, pick_path_sampled


class TreeStep:
    def __init__(self, target, drafter, shape: TreeShape, rollback, sampler=None, budget=None):
        """Refuses (SpecpipeError, one line naming tree=chain) targets or drafters that cannot do trees."""
        refusal = tree_refusal(target.model, target.make_cache(), target.info.name, target.info.arch)
        if refusal:
            raise SpecpipeError(refusal)
        if not hasattr(drafter, "propose_tree"):
            raise SpecpipeError(
                f"draft={drafter.name} cannot propose token trees: "
                "use tree=chain, or draft=ngram / model / layerskip / mtp / lookahead"
            )
        if drafter.vocab_map:  # its drafts are the target's ids only along one chain (drafters/cross_vocab.py)
            raise SpecpipeError(
                f"draft.vocab_map={drafter.vocab_map}: token trees need a draft with the target's tokenizer; "
                "use tree=chain"
            )
        self.target, self.drafter, self.shape, self.rollback = target, drafter, shape, rollback
        # draft=mtp reads the target's hidden states: the tree forward captures them as a chain's verify does
        self.capture = HIDDEN if drafter.needs_hidden else None
        # the run's budget sizes each tree (trees/budget.py); None: the shape alone decides (scripts, tests).
        # Free: proposing costs no forward (n-gram, lookahead); an MTP head has no engine but runs forwards.
        free = drafter.engine is None and drafter.cost_per_token is None
        self.sizer = TreeSizer(budget, shape, free=free) if budget is not None else None
        self.sampler = sampler if sampler is not None and not sampler.greedy else None  # None: greedy
        self.new_ids: list[int] = []
        self.accepted = 0

    def run(self, step: int, clock, context: list[int], last_id: int, cache: list, room: int):
        drafter = self.drafter
        # ---- draft: scored candidates, cut to the shape, the budget and the tokens still wanted
        s = time.perf_counter()
        f0 = drafter.forwards
        shape, probing = self.sizer.plan() if self.sizer is not None else (self.shape, False)
        wanted = room > 0 and shape is not None
        draft: TreeDraft = drafter.propose_tree(context, shape) if wanted else TreeDraft(TokenTree())
        tree = shape.select(draft.candidates) if shape is not None else TokenTree()
        forwards = drafter.forwards - f0
        decision = None
        if self.sizer is not None:
            self.sizer.hindsight(context, None)  # settle what earlier plain steps' candidates predicted
            if wanted:
                n = self.sizer.size(tree, forwards, probing)
                if n == 0:
                    self.sizer.hindsight(context, tree)  # a free look: checked against the next tokens
                tree = self.sizer.cut(tree, n)
            decision = self.sizer.decision if wanted or shape is None else None  # room 0: nothing to decide
        tree = prune_depth(tree, room)
        draft_s = time.perf_counter() - s
        yield Drafted(
            t=clock(),
            step=step,
            k=len(tree),
            draft_ids=list(tree.tokens),
            tree_parents=list(tree.parents),
            seconds=draft_s,
            forwards=forwards,
            draft_forwards=forwards,
            catchup_tokens=draft.catchup_tokens,
            probe=probing and len(tree) > 0,
            decision=decision,
        )

        # ---- verify + compare: one forward over [last_id, *nodes], the longest path the target agrees with
        s = time.perf_counter()
        start = cache[0].offset
        result = tree_forward(self.target, cache, last_id, tree, self.capture)
        logits, hidden = result.logits, result.hidden
        verdict = self._compare(tree, logits)
        path_ids = [tree.tokens[i] for i in verdict.path]
        if hidden is not None:
            # the tape mirrors the compacted cache: the root's row, then the path's, at the root's position
            # (len(context) - 1, as the chain's verify); off-path rows never reach the drafter
            rows = mx.array([0] + [i + 1 for i in verdict.path], dtype=mx.int32)
            drafter.observe_hidden(len(context) - 1, [last_id, *path_ids], hidden[rows])
        on_path = set(verdict.path)
        verify_s = time.perf_counter() - s
        yield Verified(
            t=clock(),
            step=step,
            accepted_ids=path_ids,
            rejected_ids=[t for i, t in enumerate(tree.tokens) if i not in on_path],
            recovered_id=None if verdict.bonus else verdict.next_id,
            bonus_id=verdict.next_id if verdict.bonus else None,
            seconds=verify_s,
            accepted_path=verdict.path,
            tree_depth=max(tree.depths(), default=0),
        )

        if hasattr(drafter, "observe_tree"):  # draft=lookahead: the window's outputs advance its Jacobi iteration
            drafter.observe_tree(len(context), tree, mx.argmax(logits, axis=-1).tolist(), len(path_ids) + 1)

        # ---- compact: the target keeps root + path; the drafter keeps what of its chain the path confirmed
        s = time.perf_counter()
        keep_path(cache, start, [0] + [i + 1 for i in verdict.path])
        agreed = 0
        while agreed < min(len(path_ids), len(draft.cached_tail)) and path_ids[agreed] == draft.cached_tail[agreed]:
            agreed += 1
        # the drafter rolls its own cache back (a draft model) or counts what its next draft drops (an MTP
        # head's chained pairs), as on the chain path; cacheless drafters drop nothing
        draft_drop = drafter.rollback(len(context) + agreed)
        yield RolledBack(
            t=clock(),
            step=step,
            strategy="tree-compact",
            target_dropped=len(tree) - len(path_ids),
            draft_dropped=draft_drop,
            seconds=time.perf_counter() - s,
        )
        if self.sizer is not None:
            self.sizer.observe(tree, verdict.path, draft_s, verify_s, forwards)
        self.new_ids, self.accepted = path_ids + [verdict.next_id], len(path_ids)

    def _compare(self, tree: TokenTree, logits: mx.array):
        """Greedy: the path of argmaxes. Sampling: recursive rejection sampling (verify.py)."""
        if self.sampler is None:
            return pick_path(tree, mx.argmax(logits, axis=-1).tolist())
        sampler = self.sampler
        probs = sampler.probs(logits)  # [n + 1, vocab], processed as the chain's comparator does
        return pick_path_sampled(
            tree,
            target_probs=lambda row: np.array(probs[row], dtype=np.float64),
            uniform=lambda: mx.random.uniform(key=sampler.key()).item(),
            sample=lambda p: int(sampler.sample(mx.array(p, dtype=mx.float32)[None]).item()),
        )


def prune_depth(tree: TokenTree, max_depth: int) -> TokenTree:
    """The nodes no deeper than `max_depth` (parents come first, so indices only shift)."""
    depths = tree.depths()
    if all(d <= max_depth for d in depths):
        return tree
    out, index = TokenTree(), dict[int, int]()
    for i, (tok, parent) in enumerate(zip(tree.tokens, tree.parents)):
        if depths[i] <= max_depth:
            index[i] = out.add(tok, index[parent] if parent >= 0 else -1, tree.scores[i])
    return out
