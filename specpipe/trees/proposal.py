"""The tree half of the one step (core/step.py): a row whose drafts are token trees.

Contract: `tree_parts(target, drafter, shape, budget, gains)` refuses (SpecpipeError, one line naming
tree=chain) targets and drafters that cannot do trees and returns the row's TreeParts. Per step,
`propose_tree_row(row, room, clock)` plans (the tree sizer, trees/budget.py), asks the drafter for scored
candidates, cuts them to the shape, the budget and `room`, and yields the Drafted event; the one forward
scores [last_id, *nodes] (trees/forward.py); `TreeProposal.settle` picks the accepted path through the
row's comparator plug-in (`Comparator.compare_tree`: its rule on a tree, trees/verify.py), hands a drafter
that `needs_hidden` the root's and the path's hidden states, compacts the target cache to root + path (a
plain sequence again: the step's cache invariant) and rolls the drafter back to what of its chain the path
confirmed, yielding Verified and RolledBack.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from specpipe.core.plan import StepPlan
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted, Event, RolledBack, Verified
from specpipe.trees.budget import TreeSizer
from specpipe.trees.drafting import TreeDraft
from specpipe.trees.forward import tree_refusal
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree

if TYPE_CHECKING:
    from specpipe.core.row import Row
    from specpipe.engine.engine import ForwardResult


@dataclass
class TreeParts:
    """What a row needs to draft trees: the shape and its sizer (None: the shape alone decides)."""

    shape: TreeShape
    sizer: TreeSizer | None = None


def tree_parts(target, drafter, shape: TreeShape, budget=None, gains=None) -> TreeParts:
    """A row's tree parts, or SpecpipeError (one line naming tree=chain) for a target or drafter without trees.

    `budget` sizes each tree (trees/budget.py) with `gains` (TreeGains, conf/tree's min_gain / thin_gain);
    None: the shape alone decides (scripts, tests)."""
    refusal = tree_refusal(target.model, target.make_cache(), target.info.name, target.info.arch)
    if refusal:
        raise SpecpipeError(refusal)
    if not drafter.supports_trees:
        raise SpecpipeError(
            f"draft={drafter.name} cannot propose token trees: "
            "use tree=chain, or draft=ngram / model / layerskip / mtp / lookahead"
        )
    if drafter.vocab_map == "text":  # re-encoded text is one chain: no siblings (drafters/cross_vocab.py)
        raise SpecpipeError(
            "draft.vocab_map=text: a token tree needs the draft's own candidates at each node, which re-encoded "
            "text has not; use draft.vocab_map=intersection or tree=chain"
        )
    # Free: proposing costs no forward (n-gram, lookahead); an MTP head has no engine but runs forwards.
    free = drafter.engine is None and drafter.cost_per_token is None
    if budget is not None and gains is None:
        raise ValueError("tree_parts: a budget sizes trees with gains (TreeGains from tree.min_gain / thin_gain)")
    sizer = TreeSizer(budget, shape, free=free, gains=gains) if budget is not None else None
    return TreeParts(shape, sizer)


@dataclass
class TreeProposal:
    """One row's verified-to-be tree: what the one forward feeds after the row's last_id, and what settling needs."""

    plan: StepPlan
    draft: TreeDraft
    tree: TokenTree
    start: int  # the target cache's length before the forward (keep_path compacts after it)
    draft_s: float
    forwards: int
    capture: Any
    started: float = 0.0  # perf_counter when the forward began (the verify's seconds)
    kept_rows: list[int] = field(default_factory=list)  # after settle: the fed columns kept (root, then path)

    @property
    def fed_ids(self) -> list[int]:
        return list(self.tree.tokens)

    def settle(self, target, row: Row, result: ForwardResult, clock) -> Generator[Event, None, tuple[list[int], int]]:
        """Compare, hand hidden states on, compact both caches; returns (path + next token, path length)."""
        tree, drafter, context = self.tree, row.drafter, row.context
        logits, hidden, taps = result.logits, result.hidden, result.layer_hidden
        argmax_ids = mx.argmax(logits, axis=-1).tolist()  # [n + 1]: greedy's path, lookahead's window
        verdict = row.comparator.compare_tree(tree, logits, self.draft, argmax_ids)
        path_ids = [tree.tokens[i] for i in verdict.path]
        kept_rows = [0] + [i + 1 for i in verdict.path]  # root first, then the path
        if row.draft_capture is not None:
            # the tape mirrors the compacted cache: the root's row, then the path's, at the root's position
            # (len(context) - 1, as the chain's verify); off-path rows never reach the drafter
            kept = mx.array(kept_rows)
            drafter.observe_hidden(
                len(context) - 1,
                [row.last_id, *path_ids],
                hidden[kept] if hidden is not None else None,
                taps[kept] if taps is not None else None,
            )
        on_path = set(verdict.path)
        verify_s = time.perf_counter() - self.started
        yield Verified(
            t=clock(),
            step=row.step,
            accepted_ids=path_ids,
            rejected_ids=[t for i, t in enumerate(tree.tokens) if i not in on_path],
            recovered_id=None if verdict.bonus else verdict.next_id,
            bonus_id=verdict.next_id if verdict.bonus else None,
            seconds=verify_s,
            accepted_path=verdict.path,
            tree_depth=max(tree.depths(), default=0),
        )
        drafter.observe_tree(len(context), tree, argmax_ids, len(path_ids) + 1)  # lookahead's Jacobi window

        # ---- compact: the target keeps root + path; the drafter keeps what of its chain the path confirmed
        s = time.perf_counter()
        self.kept_rows = kept_rows
        row.storage.keep_tree_path(row, self.start, kept_rows)  # a batch keeps them at its commit (the rest holes)
        tail = self.draft.cached_tail
        agreed = 0
        while agreed < min(len(path_ids), len(tail)) and path_ids[agreed] == tail[agreed]:
            agreed += 1
        # a draft model rolls its own cache back, an MTP head counts what its next draft drops; others drop nothing
        draft_drop = drafter.rollback(len(context) + agreed)
        yield RolledBack(
            t=clock(),
            step=row.step,
            strategy=row.storage.tree_rollback,
            target_dropped=len(tree) - len(path_ids),
            draft_dropped=draft_drop,
            seconds=time.perf_counter() - s,
        )
        sizer = row.tree.sizer if row.tree is not None else None
        if sizer is not None:
            sizer.observe(tree, verdict.path, self.draft_s, verify_s, self.forwards)
        return path_ids + [verdict.next_id], len(path_ids)


def propose_tree_row(row: Row, room: int, clock) -> Generator[Event, None, TreeProposal]:
    """Plan, draft and cut this step's tree (at most `room` deep: the tokens still wanted minus the bonus)."""
    parts, drafter, context = row.tree, row.drafter, row.context
    assert parts is not None, "propose_tree_row is asked for rows with tree parts"
    s = time.perf_counter()
    f0 = drafter.forwards
    sizer = parts.sizer
    shape, probing = sizer.plan() if sizer is not None else (parts.shape, False)
    plan = StepPlan(shape=shape, probe=probing)
    wanted = room > 0 and shape is not None
    draft = drafter.propose_tree(context, shape) if wanted and shape is not None else TreeDraft(TokenTree())
    tree = shape.select(draft.candidates) if shape is not None else TokenTree()
    forwards = drafter.forwards - f0
    if sizer is not None:
        sizer.hindsight(context, None)  # settle what earlier plain steps' candidates predicted
        if wanted:
            n = sizer.size(tree, forwards, probing, cache_len=len(context) - 1)
            if n == 0:
                sizer.hindsight(context, tree)  # a free look: checked against the next tokens
            tree = sizer.cut(tree, n)
        # room 0: nothing to decide
        plan = replace(plan, nodes=len(tree), decision=sizer.decision if wanted or shape is None else None)
    tree = prune_depth(tree, room)
    draft_s = time.perf_counter() - s
    yield Drafted(
        t=clock(),
        step=row.step,
        k=len(tree),
        draft_ids=list(tree.tokens),
        tree_parents=list(tree.parents),
        seconds=draft_s,
        forwards=forwards,
        draft_forwards=forwards,
        catchup_tokens=draft.catchup_tokens,
        probe=plan.probe and len(tree) > 0,
        decision=plan.decision,
        source=draft.source,  # draft=chain: which source drafted the tree
    )
    # draft=mtp / eagle3 read the target's hidden states / taps: the tree forward records them as a chain's verify does
    capture = row.draft_capture
    start = row.storage.tree_start(row)  # the positions its cache holds: all but the newest token
    return TreeProposal(plan, draft, tree, start, draft_s, forwards, capture, time.perf_counter())


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
