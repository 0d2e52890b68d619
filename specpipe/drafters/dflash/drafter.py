"""`draft=dflash`: a DFlash block drafter proposes a whole block in one forward from the target's layer taps.

Contract: `propose(context, plan)` runs the head once over the block [last token, mask x (block_size-1)]
with the context positions' taps as keys / values, and drafts the first k = min(plan.k, block_size-1)
positions: the argmax of each, greedy or sampled (`proposal=argmax`, the default: under sampling the
comparator reads a one-hot q, which is exact: accept with p(x), else draw from p without x). The
positions are marginals, not a joint distribution, so an independently sampled block is often
incoherent: z-lab/dflash pull request #169 measured 1.16 accepted tokens per step sampling each position
against 2.96 with argmax. `proposal=sample` draws each position's token from that position's own q and
hands that q to the comparator: the positions are drawn independently and q at position i does not
depend on the drafted tokens before it, so q_i is exactly the probability the drafter proposed that
token with, and the rejection rule keeps the target's distribution. `propose_tree` keeps each
position's runners-up as siblings of the chain (trees/drafting.py's top_k_chain over the same rows).

State: the head's KV cache holds the fused taps of context positions 0..fed-1 only (a block's own keys
are never stored), so rolling back is trimming it to the longest prefix still true for the next context
(worked example: fed 10 positions of context c; the target accepts 2 of 4 drafts and the next context is
c[:11] + [a, b, t]: positions 0..9 stay, the block feeds the rows of 10, 11, 12 and starts at t).

Where the taps come from: the pipeline's prefill and verify forwards record the inputs of layers
target_layer_ids + 1 (`Capture(layers=...)`, engine/layer_taps.py) onto a HiddenTape, as draft=eagle3
does; a context the tape lacks (a bare propose) costs one uncached target forward (`target_recomputes`).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from specpipe.core.plan import StepPlan
from specpipe.core.protocols import DrafterBase
from specpipe.core.stages.draft import Draft
from specpipe.costmodel.weights import weight_bytes
from specpipe.drafters.chain import chain, to_draft
from specpipe.drafters.dflash.layout import load_head
from specpipe.drafters.hidden_tape import HiddenTape, TapeResume
from specpipe.engine import introspect
from specpipe.engine.engine import Capture
from specpipe.engine.layer_taps import check_layers
from specpipe.errors import SpecpipeError
from specpipe.trees.drafting import TreeDraft, top_k_chain
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree

PROPOSALS = ("sample", "argmax")  # draft.proposal: what a sampled run drafts at each block position


class DFlashDrafter(TapeResume, DrafterBase):
    name = "dflash"
    # engine and cache stay None: the head runs beside the target and keeps its own cache (trimmed here)
    supports_trees = True  # each position's top-k beside the chain (propose_tree)

    sampler: Any = None
    p_min: float = 0.0
    target_recomputes: int = 0  # target forwards of its own: the tape lacked the context (0 in a pipeline run)

    def __init__(self, target, path: str, sampler=None, p_min: float = 0.0, proposal: str = "argmax"):
        """
        Args:
            target: the target Engine (llama-like: its decoder layers are tapped; its embedding and LM
                head are the drafter's).
            path: draft.path: the drafter's folder (or a Hugging Face id already in the local cache).
            sampler: specpipe.core.sampling.Sampler; None or temperature 0 drafts greedily.
            p_min: budget=confidence's floor on a drafted token's top probability (0: never stop).
            proposal: draft.proposal, under sampling: `sample` draws each position from its q; `argmax`
                drafts each position's argmax (both exact; see the module docstring).
        """
        if proposal not in PROPOSALS:
            raise SpecpipeError(f"draft.proposal={proposal}: expected one of {', '.join(PROPOSALS)}")
        if not path:
            raise SpecpipeError("draft=dflash needs the drafter's folder: draft.path=/path/to/dflash-drafter")
        self.target, self.sampler, self.p_min, self.proposal = target, sampler, p_min, proposal
        self.inner, self.lm_head = introspect.llama_parts(target.model, "dflash")
        # in the target's own float type (its final norm's: never quantized), as the reference loads it beside it
        self.head, self.source = load_head(path, dtype=self.inner.norm.weight.dtype)
        if self.head.cfg.final_logit_softcapping:
            # the checkpoint names its own cap (head.py applies it): the target's bare head, not its capped one
            bare = introspect.lm_head_weights(target.model, self.inner)
            self.lm_head = bare.as_linear if bare is self.inner.embed_tokens else bare
        cfg, n_layers = self.head.cfg, len(self.inner.layers)
        width = self.inner.embed_tokens.weight.shape[1]
        if self.source.num_target_layers != n_layers or cfg.hidden_size != width:
            raise SpecpipeError(
                f"{self.source.path}: the drafter was trained on a target of {self.source.num_target_layers} layers "
                f"of width {cfg.hidden_size}, this target has {n_layers} of width {width}: "
                "use the drafter trained for this target"
            )
        vocab = target.vocab_size or self.inner.embed_tokens.weight.shape[0]
        if not 0 <= cfg.mask_token_id < vocab:
            raise SpecpipeError(
                f"{self.source.path}: mask_token_id {cfg.mask_token_id} is outside the target's {vocab} ids"
            )
        # the checkpoint names layer outputs; the engine taps layer inputs (output of i = input of i + 1)
        self.layers = tuple(i + 1 for i in self.source.target_layer_ids)
        check_layers(self.layers, n_layers)
        self._capture = Capture(layers=self.layers)
        # one head forward drafts a whole block: its cost, spread over the block's drafts
        self.cost_per_token = weight_bytes(self.head) / weight_bytes(target.model) / max(cfg.block_size - 1, 1)
        self._start()

    @property
    def capture(self) -> Capture:
        return self._capture

    def _start(self) -> None:
        """Forget everything: a new generation (prefill) or a new drafter."""
        self.tape = HiddenTape()
        self._head_cache = self.head.make_cache()
        self._fed: list[int] = []  # the context tokens whose taps the head cache holds, in order
        self.cached_len = 0

    # ---------------------------------------------------------------- the Drafter protocol

    def prefill(self, prompt_ids: list[int]) -> None:
        self._start()  # the prefill's taps arrive through observe_hidden; the head reads them at the first propose

    def observe_hidden(self, start: int, token_ids: list[int], hidden, layer_hidden=None) -> None:
        if layer_hidden is not None:
            self.tape.write(start, token_ids, layer_hidden)  # [n, num_taps * H], in self.layers' order

    def use_rollback(self, strategy) -> None:
        pass  # no target-shaped cache: the head cache is trimmed by the next propose

    def rollback(self, kept_len: int) -> int:
        return 0  # the head cache holds context positions only, none of them drafts

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        self.last_tops = []
        k = min(plan.k, self.head.cfg.block_size - 1)
        if k <= 0 or len(context_ids) < 2:
            return Draft(token_ids=[])  # position 0 has no context to condition on
        tops = self.last_tops if plan.chain_stop is not None else None
        drafted, q_rows = chain(self._rows(context_ids), k, self._draw(), self.p_min, plan.chain_stop, tops)
        return to_draft(drafted, q_rows)

    def propose_tree(self, context_ids: list[int], shape: TreeShape) -> TreeDraft:
        """The block's chain of `shape.max_depth` positions with each position's `shape.width - 1` next best
        tokens as leaves (drawn without replacement from q when sampling), all from one head forward."""
        depth = min(shape.max_depth, self.head.cfg.block_size - 1)
        if depth <= 0 or len(context_ids) < 2:
            return TreeDraft(TokenTree())
        tree, _ = top_k_chain(self._rows(context_ids), depth, shape.width, self._draw())
        return TreeDraft(candidates=tree)

    # ---------------------------------------------------------------- drafting

    def _draw(self):
        """The sampler that draws the drafts; None drafts each position's argmax (greedy, or proposal=argmax)."""
        sampled = self.sampler is not None and not self.sampler.greedy
        return self.sampler if sampled and self.proposal == "sample" else None

    def block_logits(self, context_ids: list[int]) -> mx.array:
        """[block_size - 1, vocab] float32: the head's logits for the positions after the context (one forward)."""
        n = len(context_ids)
        self._forget_stale(context_ids)
        fed = len(self._fed)
        rows = self._tape_rows(context_ids, fed, n - 1)  # the taps of positions fed .. n-2
        cfg = self.head.cfg
        block = mx.array([context_ids[-1]] + [cfg.mask_token_id] * (cfg.block_size - 1), dtype=mx.uint32)
        hidden = self.head.block(block, rows, self._head_cache, self.inner.embed_tokens)
        self._fed = list(context_ids[: n - 1])
        self.forwards += 1
        self.cached_len = n - 1
        return self.head.logits(hidden[1:], self.lm_head)

    def _rows(self, context_ids: list[int]):
        """`next_logits(i, y)` for chain() / top_k_chain(): row i of one block forward (y is not needed:
        the block drafts every position at once)."""
        logits = self.block_logits(context_ids)
        return lambda i, y: logits[i : i + 1]

    def _forget_stale(self, context_ids: list[int]) -> None:
        """Trim the head cache to the fed positions still true for this context (position p's taps
        depend on tokens 0..p); keep at least one position for the block to feed."""
        fed = self._fed
        limit = len(context_ids) - 1
        if context_ids[: len(fed)] == fed:  # the usual step: the context only grew
            keep = len(fed)
        else:
            keep = next((i for i, (a, b) in enumerate(zip(fed, context_ids)) if a != b), min(len(fed), limit))
        keep = min(keep, limit - 1)
        drop = len(fed) - keep
        if drop > 0:
            for c in self._head_cache:
                c.trim(drop)
            del self._fed[keep:]

    def _tape_rows(self, context_ids: list[int], begin: int, end: int) -> mx.array:
        """The taps of positions [begin, end) from the tape; one uncached target forward over the context when
        the tape does not hold it (a drafter used outside the pipeline)."""
        if not self.tape.covers(context_ids, end):
            self.target_recomputes += 1
            result = self.target.forward(context_ids[:end], None, capture=self.capture)  # logits never evaluated
            assert result.layer_hidden is not None, "capture asks for the layer taps"
            self.tape.write(0, context_ids[:end], result.layer_hidden)
        return self.tape.rows(begin, end)
