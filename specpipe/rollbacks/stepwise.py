"""Per-position recurrent states from a multi-token forward (`rollback=checkpoint`).

Contract: `install()` patches, once per process, the `__call__` of the
recurrent mixer classes in MIXERS. When the cache entry a patched mixer
receives is being captured (`start(leaf)`), a T-token call runs as T
one-token calls of the original method, and the entry's state slots are
recorded after each position; the outputs are concatenated back. For any
other cache (`None`, attention, not captured) the patched call *is* the
original call. `stop(leaf)` ends the capture and returns the `Capture`.

Why one-token calls: mlx-lm's recurrent kernels (gated delta rule, SSD scan,
RG-LRU, WKV7) return only the final state, and the one-token path is exactly
the decoding path, so each recorded state is bitwise what decoding that
prefix would have stored (given the same layer input), conv windows
included. Attention layers stay batched; only the mixer loops, and the
recurrence is O(1) per token either way. The loop assumes mixers *rebind*
their slots (`cache[1] = state`) rather than updating arrays in place, which
every mixer listed here does (the round-trip tests pin it).

Worked example (K = 3, verify feeds [last, d1, d2, d3]): slots[j] holds
[s(last), s(d1), s(d2), s(d3)]; the comparator accepts 1 draft -> keep 2
positions -> restore slots[j][2 - 1] = s(d1); keep 0 -> restore `before`.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import mlx.core as mx

from specpipe.rollbacks.layers import slot_bytes

# mlx_lm.models.<module>: the classes that own a recurrent cache entry. A
# family is listed once its losslessness test passes (tests/test_recurrent.py).
MIXERS: dict[str, tuple[str, ...]] = {
    "qwen3_next": ("Qwen3NextGatedDeltaNet",),  # Gated DeltaNet + conv, hybrid with attention
    "qwen3_5": ("GatedDeltaNet",),  # also serves qwen3_5_moe, which reuses it
    "mamba2": ("Mamba2Block",),
    "nemotron_h": ("NemotronHMamba2Mixer",),
    "falcon_h1": ("FalconH1Mixer",),  # parallel Mamba2 + attention in one CacheList
    "lfm2": ("ShortConv",),
    "mamba": ("MambaBlock",),
    "recurrent_gemma": ("RecurrentBlock",),  # conv + RG-LRU
    "rwkv7": ("Rwkv7TimeMixing", "Rwkv7ChannelMixing"),  # both write slots of one entry
}

CAPTURE = "_specpipe_capture"  # attribute on a cache entry while it is captured
SERVED = "_specpipe_stepwise"  # set on every cache entry a patched mixer has seen


class Capture:
    """The states of one recurrent cache entry after each position fed since `start`.

    Attributes:
        before: the entry's slots when the capture started (position 0).
        slots: slot index -> [state after fed position 0, 1, ...]; only
            slots some mixer wrote appear.
        limit_bytes: stop recording (`overflow`) past this many bytes.
    """

    def __init__(self, before: list, limit_bytes: float = float("inf")):
        self.before = before
        self.slots: dict[int, list] = {}
        self.limit_bytes = limit_bytes
        self.nbytes = 0
        self.overflow = limit_bytes <= 0  # a capture that only keeps `before` (auto's recompute path)

    def record(self, leaf, prior: list) -> None:
        """Store the slots `leaf` changed in its last one-token call."""
        if self.overflow:
            return
        for j, (old, new) in enumerate(zip(prior, leaf.cache)):
            if new is not old:
                self.slots.setdefault(j, []).append(new)
                self.nbytes += 0 if new is None else new.nbytes
        if self.nbytes > self.limit_bytes:
            self.overflow, self.slots = True, {}  # free what was kept; the caller recomputes instead

    def positions(self) -> int | None:
        """Positions recorded for every written slot; None if they disagree or overflowed."""
        lengths = {len(v) for v in self.slots.values()}
        if self.overflow or len(lengths) > 1:
            return None
        return lengths.pop() if lengths else 0

    def state_at(self, keep: int) -> list:
        """The entry's slots after the first `keep` fed positions."""
        if keep == 0:
            return list(self.before)
        return [self.slots[j][keep - 1] if j in self.slots else old for j, old in enumerate(self.before)]

    def held_bytes(self, live: list) -> int:
        """Memory this capture keeps alive beyond the entry's current state."""
        return slot_bytes(list(self.before) + [a for v in self.slots.values() for a in v], exclude=live)


def start(leaf, limit_bytes: float = float("inf")) -> Capture:
    capture = Capture(list(leaf.cache), limit_bytes)
    setattr(leaf, CAPTURE, capture)
    return capture


def stop(leaf) -> Capture | None:
    capture = getattr(leaf, CAPTURE, None)
    if capture is not None:
        delattr(leaf, CAPTURE)
    return capture


def served(leaf) -> bool:
    """True once a patched mixer has run on this cache entry."""
    return getattr(leaf, SERVED, False)


def mixer_fraction(model) -> float:
    """Share of `model`'s parameters inside stepwise mixers: what checkpoint re-reads per extra position."""
    from mlx.utils import tree_flatten

    classes = tuple(_patched_classes())
    total = sum(v.size for _, v in tree_flatten(model.parameters()))
    mixers = sum(
        v.size for _, m in model.named_modules() if isinstance(m, classes) for _, v in tree_flatten(m.parameters())
    )
    return mixers / max(total, 1)


def _patched_classes():
    for module, names in MIXERS.items():
        mod = importlib.import_module(f"mlx_lm.models.{module}")
        yield from (getattr(mod, name) for name in names)


def install() -> None:
    """Patch every class in MIXERS (idempotent)."""
    for module, names in MIXERS.items():
        mod = importlib.import_module(f"mlx_lm.models.{module}")
        for name in names:
            cls = getattr(mod, name)
            if not getattr(cls.__call__, "_specpipe_stepwise", False):
                cls.__call__ = _stepwise(cls.__call__)


# ---------------------------------------------------------------- the patch


def _stepwise(call):
    signature = inspect.signature(call)
    params = list(signature.parameters)
    x_name = params[1]  # every mixer takes its hidden states first (after self)

    @functools.wraps(call)
    def stepwise_call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        cache = bound.arguments.get("cache")
        if cache is not None and not isinstance(cache, list):
            setattr(cache, SERVED, True)
        capture = getattr(cache, CAPTURE, None)
        if capture is None or capture.overflow:
            return call(*args, **kwargs)  # not captured (or given up): the batched original
        x = bound.arguments[x_name]
        b, t = x.shape[:2]
        outs = []
        for i in range(t):
            # Slice every per-position argument ([B, T, ...]: hidden states,
            # RWKV7's v_first, [B, T] SSM masks); pass the rest unchanged.
            step = inspect.BoundArguments(signature, {
                name: v[:, i : i + 1] if _per_position(v, b, t) else v for name, v in bound.arguments.items()
            })
            prior = list(cache.cache)  # type: ignore[union-attr]  # a capture implies a cache
            outs.append(call(*step.args, **step.kwargs))
            capture.record(cache, prior)
        return _join(outs)

    stepwise_call._specpipe_stepwise = True  # type: ignore[attr-defined]
    return stepwise_call


def _per_position(v, b: int, t: int) -> bool:
    return isinstance(v, mx.array) and v.ndim >= 2 and v.shape[0] == b and v.shape[1] == t


def _join(outs: list):
    """Concatenate per-position outputs along the sequence axis (tuples element-wise)."""
    first = outs[0]
    if len(outs) == 1:
        return first
    if isinstance(first, tuple):
        return tuple(_join([o[i] for o in outs]) for i in range(len(first)))
    if isinstance(first, mx.array):
        return mx.concatenate(outs, axis=1)
    return first  # None and other constants pass through
