"""`draft=mtp`: a multi-token-prediction head drafts from the target's own
hidden state (Qwen3.5 / Qwen3-Next `mtp.*`, DeepSeek-V3 / GLM nextn, or a
head made by `specpipe-train-drafter`).

Contract: the pipeline hands it the target's hidden states of every prefill
and verify forward (`observe_hidden`; it declares `needs_hidden`, so its
`capture` is the final hidden state), which it keeps on a HiddenTape. Feeding,
chaining, trees, rollback and hindsight are drafters/tape_head.py's (shared
with draft=eagle3; its docstring has the worked example): this module says how
the head runs: pairs (h[i-1], embedding of token i) through `self.head`, the
target's own LM head over its output.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from specpipe.costmodel.weights import weight_bytes
from specpipe.drafters.mtp_head import load_head
from specpipe.drafters.tape_head import TapeHead
from specpipe.engine.introspect import lm_head_weights


class MtpDrafter(TapeHead):
    name = "mtp"
    needs_hidden = True  # the pipeline passes the target's hidden states to observe_hidden

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
        # budget=auto's prior for c: a chained step reads the head and the whole LM head (a 49k-row
        # vocabulary is ~1/5 of SmolLM2's bytes), nothing else of the target
        self.cost_per_token = weight_bytes(self.head, lm_head_weights(target.model, self.inner)) / weight_bytes(
            target.model
        )
        self.p_min = p_min
        self._start()

    def _new_head_cache(self) -> list:
        return [KVCache()]

    def _tape_rows(self, hidden, layer_hidden):
        return hidden

    def _feed(self, rows, tokens):
        return self.head(rows[None], self.inner.embed_tokens(tokens)[None], self._head_cache[0])[:, -1:]

    def _next(self, x, y):
        return self.head(x, self.inner.embed_tokens(y)[None], self._head_cache[0])

    def _logits(self, x):
        return self.lm_head(x)[0].astype(mx.float32)  # [1, vocab]
