"""A drafter whose head reads the target's own rows off a HiddenTape: what draft=mtp and draft=eagle3 share.

Contract: the pipeline's prefill and verify forwards record what `capture` asks for and hand it to
`observe_hidden`; the subclass's `_tape_rows` picks the tape's rows from it (an MTP head: the final
hidden state; an EAGLE-3 head: the layer taps). `propose(context, plan)` feeds the head one (row[i-1],
token i) pair per context position it has not seen, then chains k-1 more steps on the head's own
output; `propose_tree` chains the same steps and keeps each depth's runners-up as siblings (drawn from
q under sampling, trees/drafting.py). The head's KV cache is not a list of target-shaped caches, so
`cache = None` and this class keeps it consistent: each propose first drops the chained pairs of the
last step (their row was the head's guess, not the target's) and any pair whose tokens left the context.

Worked example (context [a, b, c, d], k=3): the tape holds r0 r1 r2 (d is the newest token, not yet
through the target). Pairs (r0,b) (r1,c) (r2,d) give x3 -> draft e; then (x3,e) -> f, (x4,f) -> g.
The target accepts e, f and emits t: context [a..f, t], tape r0..r5. The next propose trims the 2
chained pairs and feeds (r3,e) (r4,f) (r5,t).

A subclass says how its head runs: `_new_head_cache`, `_feed(rows, tokens)` (the state after the
last pair), `_next(state, y)` (one chained step) and `_logits(state)` ([1, target vocab] float32).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from specpipe.core.plan import StepPlan
from specpipe.core.protocols import DrafterBase
from specpipe.core.stages.draft import Draft
from specpipe.drafters.chain import chain, to_draft
from specpipe.drafters.hidden_tape import HiddenTape, TapeResume
from specpipe.trees.drafting import TreeDraft, top_k_chain
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree


class TapeHead(TapeResume, DrafterBase):
    # engine and cache stay None: the head is not an Engine (it runs beside the target) and its cache is
    # managed here (see the module docstring), not by the rollback stage
    supports_hindsight = True  # the head's guess for emitted tokens costs head forwards only
    supports_trees = True  # the head's top-k chain (propose_tree)

    target: Any
    sampler: Any = None
    p_min: float = 0.0
    forwards: int = 0  # head forwards over the drafter's lifetime (prefill keeps counting)
    target_recomputes: int = 0  # target forwards of its own: the tape lacked the context (0 in a pipeline run)

    def _start(self) -> None:
        """Forget everything: a new generation (prefill) or a new drafter."""
        self.tape = HiddenTape()
        self._head_cache = self._new_head_cache()
        self._seen: list[int] = []  # context tokens behind the pairs in the head cache
        self._pairs = 0  # pairs (row[i-1], t[i]) for i = 1.._pairs, with the target's rows
        self.cached_len = 0

    # ---------------------------------------------------------------- what a subclass defines

    def _new_head_cache(self) -> list:
        raise NotImplementedError

    def _tape_rows(self, hidden: mx.array | None, layer_hidden: mx.array | None) -> mx.array | None:
        """Of what `capture` recorded, the rows the tape keeps."""
        raise NotImplementedError

    def _feed(self, rows: mx.array, tokens: mx.array) -> Any:
        """Run the head over the pairs (rows[j], tokens[j]); the state after the last one."""
        raise NotImplementedError

    def _next(self, state: Any, y: mx.array) -> Any:
        """One chained step: the head's own output with the drafted token y ([1] uint32)."""
        raise NotImplementedError

    def _logits(self, state: Any) -> mx.array:
        """[1, target vocab] float32 logits of the next token."""
        raise NotImplementedError

    # ---------------------------------------------------------------- the Drafter protocol

    def prefill(self, prompt_ids: list[int]) -> None:
        self._start()  # the prefill's rows arrive through observe_hidden; the head sees them at the first propose

    def observe_hidden(self, start: int, token_ids: list[int], hidden, layer_hidden=None) -> None:
        """What the forward that fed `token_ids` at cache positions start.. recorded (overwrites from start)."""
        rows = self._tape_rows(hidden, layer_hidden)
        if rows is not None:
            self.tape.write(start, token_ids, rows)

    def use_rollback(self, strategy) -> None:
        pass  # no target-shaped cache: the head cache is trimmed by the next propose

    def rollback(self, kept_len: int) -> int:
        """Chained positions beyond the accepted prefix (for the RolledBack event); the next propose drops them."""
        drop = max(0, self.cached_len - kept_len)
        self.cached_len -= drop
        return drop

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        self.last_tops = []
        sampled = self.sampler is not None and not self.sampler.greedy
        return self._draft(context_ids, plan.k, sampled=sampled, stop=plan.chain_stop)

    def hindsight(self, context_ids: list[int], m: int) -> list[int]:
        """The head's greedy guess for the last m tokens, from the tape alone (no target forward).

        The next propose drops these chained pairs as it drops any step's.
        """
        return self._draft(context_ids[:-m], m, sampled=False).token_ids if m > 0 else []

    def propose_tree(self, context_ids: list[int], shape: TreeShape) -> TreeDraft:
        """A chain of `shape.max_depth` head steps with each depth's `shape.width - 1` next best tokens as
        leaves (drawn without replacement from q when sampling; tree != chain, specpipe/trees/). Its first
        branch is what `propose(context, max_depth)` drafts, for the same head forwards; the siblings are free."""
        n = len(context_ids)
        if shape.max_depth <= 0 or n < 2:
            return TreeDraft(TokenTree())  # position 0 has no previous row to pair with
        tree, drafted = top_k_chain(self._head_steps(context_ids), shape.max_depth, shape.width, self.sampler)
        # the head cache holds the chain's pairs, as after propose: the next propose drops them (the path's
        # rows reach the tape from the tree's verify forward), so no cached_tail to roll back
        self.cached_len = n + len(drafted) - 1
        return TreeDraft(candidates=tree)

    # ---------------------------------------------------------------- drafting

    def _draft(self, context_ids: list[int], k: int, sampled: bool, stop=None) -> Draft:
        n = len(context_ids)
        if k <= 0 or n < 2:
            return Draft(token_ids=[])  # position 0 has no previous row to pair with
        tops = self.last_tops if stop is not None else None
        # a chain cut by a floor computed the token it dropped: its forward is counted all the same
        drafted, q_rows = chain(
            self._head_steps(context_ids), k, self.sampler if sampled else None, self.p_min, stop, tops
        )
        self.cached_len = n + max(len(drafted), 1) - 1  # context + chained drafts (for the RolledBack event)
        return to_draft(drafted, q_rows)

    def _head_steps(self, context_ids: list[int]):
        """Feed the head the context's pairs it has not seen; returns `next_logits(i, y)` -> [1, vocab]
        for chain() / top_k_chain(): step 0 reads that feed's last output, each later step chains the
        head's own output with the drafted token y. Each step counts one forward."""
        n = len(context_ids)
        self._forget_stale(context_ids)
        rows = self._rows(context_ids, self._pairs, n - 1)  # row[pairs] .. row[n-2]
        state = self._feed(rows, mx.array(context_ids[self._pairs + 1 : n], dtype=mx.uint32))
        self._seen, self._pairs = list(context_ids), n - 1

        def next_logits(i: int, y):
            nonlocal state
            self.forwards += 1
            if i > 0:  # chain: the head's own output stands in for the target's row
                state = self._next(state, y.astype(mx.uint32))
            return self._logits(state)

        return next_logits

    def _forget_stale(self, context_ids: list[int]) -> None:
        """Trim the head cache to the pairs still true for this context (pair i uses tokens 0..i)."""
        seen = self._seen
        if context_ids[: len(seen)] == seen:  # the usual step: the context only grew (one C-level compare)
            same = len(seen)
        else:  # a rewind or a new generation: find where they part
            same = next(
                (i for i, (a, b) in enumerate(zip(seen, context_ids)) if a != b), min(len(seen), len(context_ids))
            )
        # at least one pair is fed each step: its output is the first draft
        self._pairs = min(self._pairs, max(same - 1, 0), len(context_ids) - 2)
        drop = self._head_cache[0].offset - self._pairs
        if drop > 0:
            for c in self._head_cache:
                c.trim(drop)

    def _rows(self, context_ids: list[int], begin: int, end: int) -> mx.array:
        """The target's rows for positions [begin, end), from the tape; one uncached target forward over the
        context when the tape does not hold it (a drafter used outside the pipeline)."""
        if not self.tape.covers(context_ids, end):
            self.target_recomputes += 1
            result = self.target.forward(context_ids[:end], None, capture=self.capture)  # logits never evaluated
            rows = self._tape_rows(result.hidden, result.layer_hidden)
            assert rows is not None, "capture records what _tape_rows reads"
            self.tape.write(0, context_ids[:end], rows)
        return self.tape.rows(begin, end)
