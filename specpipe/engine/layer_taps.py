"""The hidden states entering chosen decoder layers, recorded during one forward.

Contract: `tapping(model, layers)` puts a `LayerTap` in each chosen slot of the
inner model's decoder-layer list for the block and always puts the layers back;
`Taps.joined()` then holds, per position, the residual stream entering layer i
for each i (index N = one past the last layer: the last layer's output, before
the final norm), concatenated in the order asked. This is what EAGLE-3 heads
read: SafeAILab/EAGLE `eagle/model/modeling_llama_kv.py` records `hidden_states`
before layers 2, N//2 and N-3, and vLLM's llama.py records the input of each
`aux_hidden_state_layers` index the same way. It computes nothing itself: the
layers run exactly as mlx-lm built them, so the logits do not change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn

from specpipe.engine import introspect
from specpipe.errors import SpecpipeError


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low / mid / high taps for an N-layer target: inputs of layers 2, N//2 and N-3.

    SafeAILab/EAGLE (`idx==len(self.layers)-3 or idx==len(self.layers)//2 or idx==2`), AngelSlim's
    copies of it, speculators' `resolve_target_layer_ids` and vLLM all choose these.
    """
    return (2, num_layers // 2, num_layers - 3)


def decoder_layers(model: nn.Module) -> list:
    """The inner model's decoder-layer list (introspect.llama_parts)."""
    inner, _ = introspect.llama_parts(model, "eagle3")
    return inner.layers


def check_layers(layers: Sequence[int], num_layers: int) -> None:
    """Refuse tap indices outside 0..N (N: the last layer's output) or repeated ones, in one line."""
    bad = [i for i in layers if not 0 <= i <= num_layers]
    if bad or len(set(layers)) != len(layers):
        raise SpecpipeError(
            f"hidden-state taps {list(layers)} do not fit a target with {num_layers} layers: "
            f"each must be distinct and in 0..{num_layers} (the input of that layer; {num_layers}: the last output)"
        )


class LayerTap:
    """Stands in for one decoder layer: records its input (or output), then is the layer."""

    def __init__(self, layer, record_output: bool = False):
        self.layer = layer
        self.record_output = record_output
        self.rows: list[mx.array] = []  # [B, T, H] per call

    def __call__(self, x, *args, **kwargs):
        out = self.layer(x, *args, **kwargs)
        self.rows.append(out if self.record_output else x)
        return out

    def __getattr__(self, name):  # a model's loop may read a layer's flags (e.g. is_sliding)
        return getattr(self.layer, name)


class Taps:
    """The taps of one block, in the order asked."""

    def __init__(self, taps: list[LayerTap]):
        self.taps = taps

    def joined(self) -> mx.array | None:
        """[B, T, len(layers) * H]: each tap's rows concatenated along the features (None: nothing ran)."""
        if not self.taps or any(not t.rows for t in self.taps):
            return None
        per_tap = [t.rows[0] if len(t.rows) == 1 else mx.concatenate(t.rows, axis=1) for t in self.taps]
        return mx.concatenate(per_tap, axis=-1)


@contextlib.contextmanager
def tapping(model: nn.Module, layers: Sequence[int]) -> Iterator[Taps]:
    """Record the hidden states entering `layers` of `model` during the block.

    Args:
        layers: tap indices, 0..N (see the module docstring); order is kept.

    Raises:
        SpecpipeError for an index the model does not have, or a model that is not llama-like.
    """
    slots = decoder_layers(model)
    n = len(slots)
    check_layers(layers, n)
    # a tap at N reads the last layer's output; a tap at N-1 reads its input: both can share the last slot
    taps = [LayerTap(slots[min(i, n - 1)], record_output=i == n) for i in layers]
    placed: list[tuple[int, object]] = []
    try:
        for i, tap in zip(layers, taps):
            slot = min(i, n - 1)
            placed.append((slot, slots[slot]))
            inner = slots[slot]
            tap.layer = inner  # two taps on one slot chain: the outer one calls the inner tap
            slots[slot] = tap
        yield Taps(taps)
    finally:
        for slot, original in reversed(placed):
            slots[slot] = original
