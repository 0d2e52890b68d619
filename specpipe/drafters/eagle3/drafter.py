"""`draft=eagle3`: a published EAGLE-3 head drafts from the target's low / mid / high hidden states.

Contract: `propose(context, plan)` (k = plan.k) feeds the head one (taps[i-1], token i) pair per
context position it has not seen, then chains k-1 more steps on the head's own output (EAGLE's
`topK_genrate` with one branch). Drafts are target ids (`d2t`); under sampling each drafted
position's q is over the target vocabulary with 0 outside the draft vocabulary, so the
comparator keeps the target's distribution exact. The head's KV cache is its own (`cache =
None`): each propose first drops the chained pairs of the last step and any pair whose tokens
left the context, as draft=mtp does (drafters/mtp.py has the worked example).

Where the taps come from: a `HiddenTape` of [n, num_taps * H] rows per target cache position. The
drafter's `capture` asks the pipeline's own prefill and verify forwards (chain and tree) to record
the decoder-layer inputs it reads (`Capture(layers=...)`, engine/layer_taps.py), which reach
`observe_hidden` as `layer_hidden`: no target forward of its own. Used outside the pipeline (a
bare propose), a context the tape does not hold costs one uncached target forward over it
(`target_recomputes` counts them; 0 in a pipeline run).
"""

from __future__ import annotations

import mlx.core as mx

from specpipe.core.plan import StepPlan
from specpipe.core.protocols import DrafterBase
from specpipe.core.stages.draft import Draft
from specpipe.costmodel.weights import weight_bytes
from specpipe.drafters.chain import chain, to_draft
from specpipe.drafters.eagle3.layouts import load_head
from specpipe.drafters.hidden_tape import HiddenTape
from specpipe.engine import introspect
from specpipe.engine.engine import Capture
from specpipe.engine.layer_taps import check_layers, default_layers
from specpipe.errors import SpecpipeError


class Eagle3Drafter(DrafterBase):
    name = "eagle3"
    supports_hindsight = True  # the head's guess for emitted tokens costs head forwards only

    def __init__(self, target, path: str, sampler=None, p_min: float = 0.0, layers: list[int] | None = None):
        """
        Args:
            target: the target Engine (llama-like: its decoder layers are tapped, its embedding
                is shared with a head that ships none).
            path: draft.path: the head's folder (or a Hugging Face id already in the local cache).
            sampler: specpipe.core.sampling.Sampler; None or temperature 0 drafts greedily.
            p_min: budget=confidence's floor on a drafted token's top probability (0: never stop).
            layers: draft.layers: the taps, overriding the checkpoint's and EAGLE's default (2, N//2, N-3).
        """
        if not path:
            raise SpecpipeError("draft=eagle3 needs the head's folder: draft.path=/path/to/eagle3-head")
        self.target, self.sampler, self.p_min = target, sampler, p_min
        inner, _ = introspect.llama_parts(target.model, "eagle3")
        self.head, self.source = load_head(path, embed=inner.embed_tokens)
        n_layers = len(inner.layers)
        taps = tuple(layers) if layers else self.source.taps or default_layers(n_layers)
        check_layers(taps, n_layers)
        cfg = self.head.cfg
        if len(taps) != cfg.num_taps or inner.embed_tokens.weight.shape[1] != cfg.target_hidden_size:
            raise SpecpipeError(
                f"{self.source.path}: the head fuses {cfg.num_taps} taps of width {cfg.target_hidden_size}, "
                f"the target gives {len(taps)} of width {inner.embed_tokens.weight.shape[1]}: "
                "use the head trained for this target"
            )
        if target.vocab_size and target.vocab_size != cfg.vocab_size:
            raise SpecpipeError(
                f"{self.source.path}: the head's vocabulary has {cfg.vocab_size} ids, "
                f"the target's {target.vocab_size}: use the head trained for this target"
            )
        self.layers = taps
        self._capture = Capture(layers=taps)  # what the pipeline's forwards record for the head
        self.head_rows = cfg.draft_vocab_size
        # a chained step reads the head alone (its own LM head over the draft vocabulary)
        self.cost_per_token = weight_bytes(self.head) / weight_bytes(target.model)
        self.cached_len = 0
        self.forwards = 0  # head forwards
        self.target_recomputes = 0  # target forwards of its own: the tape lacked the context (0 in a pipeline)
        self._reset()

    def _reset(self) -> None:
        self._head_cache = self.head.make_cache()
        self._seen: list[int] = []  # context tokens behind the pairs in the head cache
        self._pairs = 0  # pairs (taps[i-1], t[i]) for i = 1.._pairs, with the target's taps
        self.tape = HiddenTape()

    # ---------------------------------------------------------------- the Drafter protocol

    def prefill(self, prompt_ids: list[int]) -> None:
        self._reset()  # the head sees the prompt at the first propose
        self.cached_len = 0

    @property
    def capture(self) -> Capture:
        return self._capture

    def observe_hidden(self, start: int, token_ids: list[int], hidden, layer_hidden=None) -> None:
        """The taps [n, num_taps * H] (`layer_hidden`) of `token_ids` fed at cache positions start.."""
        if layer_hidden is not None:
            self.tape.write(start, token_ids, layer_hidden)

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
        """The head's greedy guess for the last m tokens (the next propose drops these chained pairs)."""
        return self._draft(context_ids[:-m], m, sampled=False).token_ids if m > 0 else []

    # ---------------------------------------------------------------- drafting

    def _draft(self, context_ids: list[int], k: int, sampled: bool, stop=None) -> Draft:
        n = len(context_ids)
        if k <= 0 or n < 2:
            return Draft(token_ids=[])  # position 0 has no previous hidden state to pair with
        tops = self.last_tops if stop is not None else None
        drafted, q_rows = chain(
            self._head_steps(context_ids), k, self.sampler if sampled else None, self.p_min, stop, tops
        )
        self.cached_len = n + max(len(drafted), 1) - 1  # context + chained drafts (for the RolledBack event)
        return to_draft(drafted, q_rows)

    def _head_steps(self, context_ids: list[int]):
        """Feed the head the context's unseen pairs; returns chain()'s `next_logits(i, y)` -> [1, vocab]
        target-vocabulary logits (-inf outside the draft vocabulary). Each step counts one forward."""
        n = len(context_ids)
        self._forget_stale(context_ids)
        taps = self._taps(context_ids, self._pairs, n - 1)  # [m, 3H]: taps[pairs] .. taps[n-2]
        tokens = mx.array(context_ids[self._pairs + 1 : n], dtype=mx.uint32)
        logits, out = self.head.step(tokens, self.head.fuse(taps), self._head_cache)
        state = {"logits": logits[-1:], "x": out[-1:]}
        self._seen, self._pairs = list(context_ids), n - 1

        def next_logits(i: int, y):
            self.forwards += 1
            if i > 0:  # chain: the head's own output stands in for the target's taps
                state["logits"], state["x"] = self.head.step(y.astype(mx.uint32), state["x"], self._head_cache)
            return self.head.target_logits(state["logits"])

        return next_logits

    def _forget_stale(self, context_ids: list[int]) -> None:
        """Trim the head cache to the pairs still true for this context (pair i uses tokens 0..i)."""
        same = _common(self._seen, context_ids)
        self._pairs = min(self._pairs, max(same - 1, 0), len(context_ids) - 2)
        drop = self._head_cache[0].offset - self._pairs
        if drop > 0:
            for c in self._head_cache:
                c.trim(drop)

    def _taps(self, context_ids: list[int], begin: int, end: int) -> mx.array:
        """The target's taps for positions [begin, end), from the tape; one uncached target forward over
        the context when the tape does not hold it (a drafter used outside the pipeline)."""
        if not self.tape.covers(context_ids, end):
            self.target_recomputes += 1
            rows = self.target.forward(context_ids[:end], None, capture=self._capture).layer_hidden
            self.tape.write(0, context_ids[:end], rows)  # its logits are never evaluated
        return self.tape.rows(begin, end)


def _common(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two id lists."""
    if b[: len(a)] == a:
        return len(a)
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
