"""`draft.vocab=N`: the draft model's LM head scores N token ids, not the whole vocabulary.

A draft token's cost is the weight bytes it reads, and the LM head is a large share of a small
model's: Qwen2.5-0.5B's tied head (151,936 x 896) is 27% of its weights, and on this CPU a
draft token took ~25% less time with a 32k-row head (docs/benchmarks.md). The draft only has to
guess what the target will say, and that is nearly always a frequent token or one already in the
context (FR-Spec, Zhao et al. 2025, restricts the draft head the same way). So the head keeps:

- the N lowest ids: byte-level BPE tokenizers (Qwen, Llama 3, GPT-2) number their merges in the
  order they were learned, most frequent first;
- every id of the prompt and of the output so far (an identifier the edit renames, a rare word);
- the end-of-sequence ids, so the draft can still propose stopping.

The target scores the full vocabulary, so the output is unchanged: greedy verification keeps the
target's argmax; under sampling the draft distribution q is zero outside the set, and rejection
sampling is exact for any q. What a smaller set can cost is acceptance, never correctness.

Example: N = 4, vocab 10, eos 9, prompt [2, 7] -> rows [0, 1, 2, 3, 9, 7]; logits come back
[.., 10] with -inf at 4, 5, 6 and 8.
"""

from __future__ import annotations

from collections.abc import Iterable

import mlx.core as mx
import mlx.nn as nn

from specpipe.costmodel.weights import weight_bytes
from specpipe.engine import introspect
from specpipe.errors import SpecpipeError


class DraftVocab:
    """The rows of a draft model's LM head that a draft may propose, and logits over only those."""

    def __init__(self, head: nn.Module, size: int, always: Iterable[int]):
        """
        Args:
            head: the module whose weight rows are the LM head's (`head_module`).
            size: N, the lowest ids kept whatever the context.
            always: ids kept as well (end of sequence).
        """
        self._head = head
        self.vocab = int(head.weight.shape[0])
        self.size = min(size, self.vocab)
        self._top = self._slice(slice(0, self.size))  # a view of the first rows: nothing is copied
        self._always = {i for i in always if 0 <= i < self.vocab}
        self.reset([])

    def reset(self, context_ids: Iterable[int]) -> None:
        """Start a new generation: the frequent rows, the end ids and `context_ids`."""
        self._extra: list[int] = []
        self._known: set[int] = set()
        self._extra_rows: tuple | None = None
        self.add(self._always)
        self.add(context_ids)

    def add(self, ids: Iterable[int]) -> None:
        """Keep the rows of `ids` too (the target emitted or the prompt holds them)."""
        new = {i for i in ids if i >= self.size and i not in self._known and i < self.vocab}
        if new:
            self._known |= new
            self._extra.extend(sorted(new))
            self._extra_rows = None  # gathered again on the next logits call

    @property
    def rows(self) -> int:
        """How many head rows a draft token reads."""
        return self.size + len(self._extra)

    def bytes_share(self, model_bytes: int) -> float:
        """The share of a full draft forward's weight bytes (`model_bytes`) a draft token reads now."""
        head_bytes = weight_bytes(self._head)
        return max(0.0, 1.0 - head_bytes * (1.0 - self.rows / self.vocab) / model_bytes)

    def logits(self, hidden: mx.array) -> mx.array:
        """[n, vocab] float32 logits of the kept rows for hidden states [n, hidden]; -inf elsewhere."""
        top = self._matmul(hidden, self._top)
        parts = [top]
        if self.size < self.vocab:
            parts.append(mx.full((hidden.shape[0], self.vocab - self.size), -mx.inf, dtype=top.dtype))
        full = mx.concatenate(parts, axis=-1) if len(parts) > 1 else top
        if self._extra:
            if self._extra_rows is None:
                self._extra_rows = self._slice(mx.array(self._extra, dtype=mx.uint32))
                mx.eval(self._extra_rows)  # gathered once per new id, not once per drafted token
            full[:, mx.array(self._extra, dtype=mx.uint32)] = self._matmul(hidden, self._extra_rows)
        return full.astype(mx.float32)

    def _slice(self, rows) -> tuple:
        head = self._head
        if isinstance(head, nn.QuantizedLinear | nn.QuantizedEmbedding):
            return head.weight[rows], head.scales[rows], head.biases[rows] if head.biases is not None else None
        return (head.weight[rows],)

    def _matmul(self, hidden: mx.array, part: tuple) -> mx.array:
        head = self._head
        if len(part) == 1:
            return hidden @ part[0].T
        w, scales, biases = part
        return mx.quantized_matmul(
            hidden,
            w,
            scales,
            biases,
            transpose=True,
            group_size=head.group_size,
            bits=head.bits,
            mode=getattr(head, "mode", "affine"),
        )


def head_module(model: nn.Module, inner: nn.Module, setting: str) -> nn.Module:
    """The module whose weight rows are `model`'s LM head (lm_head, or the tied embeddings).

    `inner` is the model's inner stack (Engine.hidden_parts, which has checked that the logits are
    exactly the head over its output). Raises SpecpipeError, naming `setting`, for any other head.
    """
    head = introspect.lm_head_weights(model, inner)
    kinds = (nn.Linear, nn.Embedding, nn.QuantizedLinear, nn.QuantizedEmbedding)
    if not isinstance(head, kinds) or "bias" in head:
        raise SpecpipeError(
            f"{setting}: the draft model's LM head is a {type(head).__name__} with a bias or of another kind, "
            "so its rows cannot be picked; use draft.vocab=0"
        )
    return head
