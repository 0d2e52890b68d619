"""`draft=gemma4_assistant`: Gemma-4's published MTP drafter attends to the target's own K/V cache.

Contract: the pipeline's prefill and verify forwards record the target's final (normed) hidden states
onto a HiddenTape and point a TargetKv at the target's cache (this drafter's `capture`). `propose(context,
plan)` reads them for the accepted prefix only: the cache's K/V over positions [0, n - 1) (n =
len(context); the newest token is not in the cache yet) and the hidden state at n - 2; then chains k
assistant steps as mlx-vlm's draft_block does: step 0 pairs that hidden state with the newest token's
embedding, each later step the assistant's own output with the token it drafted; every step queries the
same K/V at the same position (n - 2). The assistant keeps no cache, so a rollback has nothing to drop:
the next propose reads the cache the pipeline's rollback left (a tree's: its compacted path; a batch row's:
its own row of the batch, lent by batch/decoder.py at join). `propose_tree` chains the same steps and keeps
each depth's runners-up as siblings, read from the same logits (trees/drafting.py's top_k_chain; drawn from q
under sampling). Under sampling q is the assistant's full-vocabulary distribution.
"""

from __future__ import annotations

import mlx.core as mx

from specpipe.core.plan import StepPlan
from specpipe.core.protocols import DrafterBase
from specpipe.core.stages.draft import Draft
from specpipe.costmodel.weights import weight_bytes
from specpipe.drafters.chain import chain, to_draft
from specpipe.drafters.gemma4_assistant.layout import load_assistant
from specpipe.drafters.hidden_tape import HiddenTape, TapeResume
from specpipe.engine import introspect
from specpipe.engine.engine import Capture
from specpipe.engine.target_kv import TargetKv
from specpipe.errors import SpecpipeError
from specpipe.trees.drafting import TreeDraft, top_k_chain
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree


class Gemma4AssistantDrafter(TapeResume, DrafterBase):
    name = "gemma4_assistant"
    needs_hidden = True
    supports_trees = True  # the assistant's top-k chain (propose_tree)

    def __init__(self, target, path: str, sampler=None, p_min: float = 0.0):
        """
        Args:
            target: the target Engine: a gemma4 / gemma4_text model (its embedding feeds the assistant).
            path: draft.path: the assistant's checkpoint folder (config.json + *.safetensors).
            sampler: specpipe.core.sampling.Sampler; None or temperature 0 drafts greedily.
            p_min: budget=confidence's floor on a drafted token's top probability (0: never stop).
        """
        if not path:
            raise SpecpipeError("draft=gemma4_assistant needs the assistant's folder: draft.path=/path/to/assistant")
        if introspect.cache_layer_types(target.model) is None:
            arch = type(target.model).__module__.rsplit(".", 1)[-1]
            raise SpecpipeError(
                f"draft=gemma4_assistant drafts for gemma4 / gemma4_text targets (it attends to their own K/V); "
                f"{target.info.name} is {arch}: use draft=ngram or draft=model"
            )
        self.target, self.sampler, self.p_min = target, sampler, p_min
        inner, _ = target.hidden_parts()  # the normed final hidden state, captured exactly (soft-capped head)
        self.embed, self.embed_scale = inner.embed_tokens, float(inner.embed_scale)
        self.model, self.source = load_assistant(path)
        cfg = self.model.cfg
        width, vocab = inner.embed_tokens.weight.shape[1], inner.embed_tokens.weight.shape[0]
        if cfg.backbone_hidden_size != width or cfg.text.vocab_size != vocab:
            raise SpecpipeError(
                f"{self.source.path}: the assistant drafts for hidden size {cfg.backbone_hidden_size} and "
                f"{cfg.text.vocab_size} ids, the target has {width} and {vocab}: use the assistant of this Gemma-4 size"
            )
        self.kv = TargetKv()
        self._capture = Capture(hidden=True, kv=self.kv)
        self.cost_per_token = weight_bytes(self.model) / weight_bytes(target.model)
        self.tape = HiddenTape()

    @property
    def capture(self) -> Capture:
        return self._capture

    # ---------------------------------------------------------------- the Drafter protocol

    def prefill(self, prompt_ids: list[int]) -> None:
        self.tape = HiddenTape()  # the prefill's rows arrive through observe_hidden

    def observe_hidden(self, start: int, token_ids: list[int], hidden, layer_hidden=None) -> None:
        self.tape.write(start, token_ids, hidden)

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        self.last_tops = []
        if plan.k <= 0 or len(context_ids) < 2:
            return Draft(token_ids=[])  # position 0 has no hidden state before it
        sampled = self.sampler is not None and not self.sampler.greedy
        tops = self.last_tops if plan.chain_stop is not None else None
        drafted, q_rows = chain(
            self._steps(context_ids), plan.k, self.sampler if sampled else None, self.p_min, plan.chain_stop, tops
        )
        return to_draft(drafted, q_rows)

    def propose_tree(self, context_ids: list[int], shape: TreeShape) -> TreeDraft:
        """A chain of `shape.max_depth` assistant steps with each depth's `shape.width - 1` next best tokens as
        leaves (drawn without replacement from q when sampling). Its first branch is what `propose(context,
        max_depth)` drafts, for the same forwards; the siblings are free. Nothing is cached, so no tail."""
        if shape.max_depth <= 0 or len(context_ids) < 2:
            return TreeDraft(TokenTree())  # position 0 has no hidden state before it
        tree, _ = top_k_chain(self._steps(context_ids), shape.max_depth, shape.width, self.sampler)
        return TreeDraft(candidates=tree)

    # ---------------------------------------------------------------- drafting

    def _steps(self, context_ids: list[int]):
        """`next_logits(i, y)` -> [1, vocab] for chain() / top_k_chain(): step 0 reads (hidden[n-2], token n-1),
        each later step the assistant's own hidden output and the drafted token y. Each step is one forward.

        Worked example (context [a, b, c, d]): the cache holds a b c (positions 0..2), the tape h0 h1 h2.
        Step 0 feeds (h2, d) at position 2 -> draft e; step 1 (out0, e) -> f; step 2 (out1, f) -> g, all
        over the K/V of a b c. After the target accepts e and emits t, the cache holds a..e: the next
        propose feeds (h4, t) over those five positions.
        """
        length = len(context_ids) - 1  # the cache's positions: all but the newest token
        if not self.tape.covers(context_ids, length):
            raise SpecpipeError(
                "draft=gemma4_assistant: the target's hidden states for this context were not recorded "
                "(it drafts inside a pipeline run, whose forwards record them)"
            )
        kv = self.kv.read(length)  # never a position past the accepted prefix
        position = length - 1  # mlx-vlm's draft position: the last cached one, held for every step
        hidden = self.tape.rows(length - 1, length)[None]  # [1, 1, backbone]
        token = mx.array([context_ids[-1]], dtype=mx.uint32)

        def next_logits(i: int, y):
            nonlocal hidden, token
            self.forwards += 1
            if i > 0:
                token = y.astype(mx.uint32)
            embedded = self.embed(token[None]) * self.embed_scale  # [1, 1, backbone]
            hidden, logits = self.model.step(embedded, hidden, kv, position)
            return logits

        return next_logits
