"""`draft=eagle3`: a published EAGLE-3 head drafts from the target's low / mid / high hidden states.

Contract: a drafter of drafters/tape_head.py's kind (as draft=mtp): `propose(context, plan)` feeds
the head one (taps[i-1], token i) pair per context position it has not seen, then chains k-1 more
steps on the head's own output (EAGLE's `topK_genrate` with one branch); `propose_tree` keeps each
depth's runners-up as siblings (EAGLE-2's top-k expansion along the chain, cut by `tree=dynamic`'s
scores). Drafts are target ids (`d2t`); under sampling each drafted position's q is over the target
vocabulary with 0 outside the draft vocabulary, so the comparator keeps the target's distribution
exact. The head's KV cache is its own (`cache = None`), trimmed by each propose.

Where the taps come from: a `HiddenTape` of [n, num_taps * H] rows per target cache position. The
drafter's `capture` asks the pipeline's own prefill and verify forwards (chain and tree) to record
the decoder-layer inputs it reads (`Capture(layers=...)`, engine/layer_taps.py), which reach
`observe_hidden` as `layer_hidden`: no target forward of its own. Used outside the pipeline (a
bare propose), a context the tape does not hold costs one uncached target forward over it
(`target_recomputes` counts them; 0 in a pipeline run).
"""

from __future__ import annotations

from specpipe.costmodel.weights import weight_bytes
from specpipe.drafters.eagle3.layouts import load_head
from specpipe.drafters.tape_head import TapeHead
from specpipe.engine import introspect
from specpipe.engine.engine import Capture
from specpipe.engine.layer_taps import check_layers, default_layers
from specpipe.errors import SpecpipeError


class Eagle3Drafter(TapeHead):
    name = "eagle3"

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
        self._start()

    @property
    def capture(self) -> Capture:
        return self._capture

    # ---------------------------------------------------------------- how the head runs (TapeHead)

    def _new_head_cache(self) -> list:
        return self.head.make_cache()

    def _tape_rows(self, hidden, layer_hidden):
        return layer_hidden  # [n, num_taps * H]: the taps side by side, in self.layers' order

    def _feed(self, rows, tokens):
        logits, out = self.head.step(tokens, self.head.fuse(rows), self._head_cache)
        return logits[-1:], out[-1:]

    def _next(self, state, y):
        return self.head.step(y, state[1], self._head_cache)  # the pre-norm hidden state chains

    def _logits(self, state):
        return self.head.target_logits(state[0])  # [1, target vocab], -inf outside the draft vocabulary
