"""`draft=mtp`: a multi-token-prediction head drafts from the target's own
hidden state (Qwen3.5 / Qwen3-Next `mtp.*`, DeepSeek-V3 / GLM nextn, or a
head made by `specpipe-train-drafter`).

Contract: the pipeline hands it the target's hidden states of every prefill
and verify forward (`observe_hidden`; it declares `needs_hidden`), which it
keeps on a HiddenTape. `propose(context, plan)` (k = plan.k) feeds the head one (h[i-1],
token i) pair per context position it has not seen, reading h from the tape,
then chains k-1 more steps on the head's own output. The head's KV cache is not a list of target-shaped caches,
so `cache = None` and the drafter keeps it consistent itself: each propose
first drops the chained pairs of the last step (their hidden state was the
head's guess, not the target's) and any pair whose tokens left the context.
`propose_tree(context, shape)` (tree != chain) chains the same greedy steps
and keeps each depth's next best tokens as siblings; the tree step hands it
the hidden states of the root and the accepted path (trees/proposal.py).

Worked example (context [a, b, c, d], k=3): the tape holds h0 h1 h2 (d is
the newest token, not yet through the target). Pairs (h0,b) (h1,c) (h2,d)
give x3 -> draft e; then (x3,e) -> f, (x4,f) -> g. Target accepts e, f and
emits r: context [a..f, r], tape h0..h5. Next propose trims the 2 chained
pairs and feeds (h3,e) (h4,f) (h5,r).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from specpipe.core.plan import StepPlan
from specpipe.core.protocols import DrafterBase
from specpipe.core.stages.draft import Draft
from specpipe.costmodel.weights import weight_bytes
from specpipe.drafters.chain import chain, to_draft
from specpipe.drafters.hidden_tape import HiddenTape
from specpipe.drafters.mtp_head import load_head
from specpipe.engine.engine import HIDDEN
from specpipe.engine.introspect import lm_head_weights
from specpipe.trees.drafting import TreeDraft, top_k_chain
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree


class MtpDrafter(DrafterBase):
    name = "mtp"
    # engine and cache stay None: the head is not an Engine (it runs on the target's arrays) and
    # its cache is managed here (see module docstring), not by the rollback stage
    supports_hindsight = True
    needs_hidden = True  # the pipeline passes the target's hidden states to observe_hidden
    supports_trees = True  # the head's top-k chain (propose_tree)

    def __init__(self, target, head: str | None = None, sampler=None, p_min: float = 0.0):
        """
        Args:
            target: the target Engine; its embedding and LM head are shared.
            head: draft.head path (see mtp_head.load_head); None: the model's own.
            sampler: specpipe.core.sampling.Sampler; None or temperature 0 drafts greedily.
            p_min: budget=confidence's floor: stop chaining below this top probability (0: never).
        """
        self.target, self.sampler = target, sampler
        self.inner, self.lm_head = (
            target.hidden_parts()
        )  # refuses a model whose hidden states it cannot capture exactly
        self.head, self.source = load_head(target, self.inner, head)
        self.tape = HiddenTape()
        # budget=auto's prior for c: a chained step reads the head and the whole LM head (a 49k-row
        # vocabulary is ~1/5 of SmolLM2's bytes), nothing else of the target
        self.cost_per_token = weight_bytes(self.head, lm_head_weights(target.model, self.inner)) / weight_bytes(
            target.model
        )
        self.cached_len = 0
        self.forwards = 0  # head forwards
        self.target_recomputes = 0  # times the tape did not cover the context (should stay 0)
        self.p_min = p_min
        self._head_cache = KVCache()
        self._seen: list[int] = []  # context tokens behind the pairs in the head cache
        self._pairs = 0  # pairs (h[i-1], t[i]) for i = 1.._pairs, with the target's h

    def prefill(self, prompt_ids: list[int]) -> None:
        # The target prefill's hidden states arrive through observe_hidden;
        # the head sees the prompt at the first propose.
        self._head_cache, self._seen, self._pairs = KVCache(), [], 0
        self.tape = HiddenTape()
        self.cached_len = 0

    def observe_hidden(self, start: int, token_ids: list[int], hidden, layer_hidden=None) -> None:
        """The target's hidden states [n, hidden] of `token_ids`, fed at cache positions start..
        (overwrites from start)."""
        if hidden is not None:
            self.tape.write(start, token_ids, hidden)

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
        """A greedy chain of `shape.max_depth` head steps with each depth's `shape.width - 1` next best
        tokens as leaves (tree != chain; specpipe/trees/). Its first branch is what a greedy
        `propose(context, max_depth)` drafts, for the same head forwards; the siblings are free."""
        n = len(context_ids)
        if shape.max_depth <= 0 or n < 2:
            return TreeDraft(TokenTree())  # position 0 has no previous hidden state to pair with
        tree, drafted = top_k_chain(self._head_steps(context_ids), shape.max_depth, shape.width)
        # the head cache holds the chain's pairs, as after propose: the next propose drops them (the path's
        # hidden states reach the tape from the tree's verify forward), so no cached_tail to roll back
        self.cached_len = n + len(drafted) - 1
        return TreeDraft(candidates=tree)

    def _draft(self, context_ids: list[int], k: int, sampled: bool, stop=None) -> Draft:
        n = len(context_ids)
        if k <= 0 or n < 2:
            return Draft(token_ids=[])  # position 0 has no previous hidden state to pair with
        tops = self.last_tops if stop is not None else None
        next_logits = self._head_steps(context_ids)
        # a chain cut by a floor computed the token it dropped: its forward is counted all the same
        drafted, q_rows = chain(next_logits, k, self.sampler if sampled else None, self.p_min, stop, tops)
        self.cached_len = n + max(len(drafted), 1) - 1  # context + chained drafts (for the RolledBack event)
        return to_draft(drafted, q_rows)

    def _head_steps(self, context_ids: list[int]):
        """Feed the head the context's pairs it has not seen; returns `next_logits(i, y)` -> [1, vocab]
        for chain() / top_k_chain(): step 0 reads that feed's last output, each later step chains the
        head's own output x with the drafted token y as the next pair. Each step counts one forward."""
        n = len(context_ids)
        self._forget_stale(context_ids)
        hidden = self._target_hidden(context_ids, self._pairs, n - 1)  # [m, H]: h[pairs] .. h[n-2]
        tokens = mx.array(context_ids[self._pairs + 1 : n], dtype=mx.uint32)
        x = self.head(hidden[None], self.inner.embed_tokens(tokens)[None], self._head_cache)[:, -1:]
        self._seen, self._pairs = list(context_ids), n - 1

        def next_logits(i: int, y):
            nonlocal x
            self.forwards += 1
            if i > 0:  # chain: the head's own output stands in for the target's hidden state
                x = self.head(x, self.inner.embed_tokens(y)[None], self._head_cache)
            return self.lm_head(x)[0].astype(mx.float32)  # [1, vocab]

        return next_logits

    def _forget_stale(self, context_ids: list[int]) -> None:
        """Trim the head cache to the pairs still true for this context.

        Pair i uses tokens 0..i, so it survives while those equal the context.
        """
        seen = self._seen
        if context_ids[: len(seen)] == seen:  # the usual step: the context only grew (one C-level compare)
            same = len(seen)
        else:  # a rewind or a new generation: find where they part
            same = next(
                (i for i, (a, b) in enumerate(zip(seen, context_ids)) if a != b), min(len(seen), len(context_ids))
            )
        # at least one pair is fed each step: its output is the first draft
        self._pairs = min(self._pairs, max(same - 1, 0), len(context_ids) - 2)
        drop = self._head_cache.offset - self._pairs
        if drop > 0:
            self._head_cache.trim(drop)

    def _target_hidden(self, context_ids: list[int], begin: int, end: int):
        """The target's h for positions [begin, end), from the tape.

        Falls back to one target forward over the context when the tape does
        not hold this context (a drafter used outside the pipeline).
        """
        if not self.tape.covers(context_ids, end):
            self.target_recomputes += 1
            hidden = self.target.forward(
                context_ids[:end], None, capture=HIDDEN
            ).hidden  # its logits are never evaluated
            self.tape.write(0, context_ids[:end], hidden)
        return self.tape.rows(begin, end)
