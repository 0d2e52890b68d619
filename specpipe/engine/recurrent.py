"""Per-position recurrent states from a multi-token forward, on request.

Contract: a caller (a rollback strategy) opens a `StateCapture` and starts a
`StateRecord` for each recurrent cache entry it wants, then passes the
capture to `Engine.forward(..., capture=Capture(states=...))`, once or over
several forwards. For the length of each such forward only, the engine puts
a `StepwiseMixer` in place of each recurrent mixer of *its own* model
(`stepwise(...)`), and puts the mixers back afterwards: no mlx-lm class and
no other model object is ever changed, and a forward without a capture runs
mlx-lm's modules untouched. A wrapped mixer whose cache entry is recorded
runs a T-token call as T one-token calls of the original module and records
the entry's state slots after each; any other entry gets the original call.

Why one-token calls: mlx-lm's recurrent kernels (gated delta rule, SSD scan,
RG-LRU, WKV7) return only the final state, and the one-token path is exactly
the decoding path, so each recorded state is bitwise what decoding that
prefix would have stored (given the same layer input), conv windows
included. Attention layers stay batched; only the mixer loops. The loop
assumes mixers *rebind* their slots (`cache[1] = state`) rather than update
arrays in place, which every mixer in introspect.MIXERS does (the round-trip
tests pin it).

Worked example (K = 3, verify feeds [last, d1, d2, d3]): slots[j] holds
[s(last), s(d1), s(d2), s(d3)]; the comparator accepts 1 draft -> keep 2
positions -> `state_at(2)` = s(d1); keep 0 -> `before`.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import mlx.core as mx


class StateRecord:
    """The states of one recurrent cache entry after each position fed since it started.

    Attributes:
        before: the entry's slots when the record started (position 0).
        slots: slot index -> [state after fed position 0, 1, ...]; only
            slots some mixer wrote appear.
        limit_bytes: stop recording (`overflow`) past this many bytes.
    """

    def __init__(self, before: list, limit_bytes: float = float("inf")):
        self.before = before
        self.slots: dict[int, list] = {}
        self.limit_bytes = limit_bytes
        self.nbytes = 0
        self.overflow = limit_bytes <= 0  # a record that only keeps `before` (auto's recompute path)

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

    def state_per_row(self, keep: list[int]) -> list:
        """The entry's slots with row b after its own first `keep[b]` fed positions (a batch of rows).

        A batch's forward feeds every row the same number of columns, padded past the shorter drafts;
        each row keeps its own count, so nothing fed after it (rejected drafts, padding) reaches its state.
        Worked example (3 fed, 2 rows, keep [3, 1]): row 0 gets s(fed 2)[0], row 1 gets s(fed 0)[1].

        Raises:
            ValueError: `keep` has not one count per row, or a count past the positions recorded.
        """
        recorded = self.positions()
        if recorded is None:
            raise ValueError("no per-position states to pick from (the record overflowed or its slots disagree)")
        if any(k < 0 or k > recorded for k in keep):
            raise ValueError(f"keep {keep}: each row keeps 0..{recorded} of the positions recorded")
        if len(set(keep)) == 1:
            return self.state_at(keep[0])  # every row kept as much: the slots as they are, no copy
        picked = []
        for j, old in enumerate(self.before):
            if j not in self.slots:
                picked.append(old)
                continue
            seq = self.slots[j]
            if seq[0].shape[0] != len(keep):
                raise ValueError(f"keep has {len(keep)} rows, the recorded states {seq[0].shape[0]}")
            start = old if old is not None else mx.zeros_like(seq[0])  # an empty slot: the zero state
            picked.append(mx.concatenate([(seq[k - 1] if k else start)[b : b + 1] for b, k in enumerate(keep)]))
        return picked

    def arrays(self) -> list:
        """Every state this record keeps alive (for memory accounting)."""
        return list(self.before) + [a for v in self.slots.values() for a in v]


class StateCapture:
    """The cache entries whose per-position states a forward should record.

    Keyed by the entry object's identity; the entries themselves carry nothing.
    """

    def __init__(self):
        self._records: dict[int, tuple[object, StateRecord]] = {}

    def start(self, leaf, limit_bytes: float = float("inf")) -> StateRecord:
        record = StateRecord(list(leaf.cache), limit_bytes)
        self._records[id(leaf)] = (leaf, record)
        return record

    def get(self, leaf) -> StateRecord | None:
        entry = self._records.get(id(leaf))
        return entry[1] if entry is not None and entry[0] is leaf else None

    def __bool__(self) -> bool:
        return bool(self._records)


# ---------------------------------------------------------------- the wrapper


class StepwiseMixer:
    """Stands in for one mixer during a capturing forward (see module docstring)."""

    def __init__(self, mixer):
        self.mixer = mixer
        self.signature = inspect.signature(mixer.__call__)
        self.x_name = next(iter(self.signature.parameters))  # every mixer takes its hidden states first
        self.capture: StateCapture | None = None

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)
        cache = bound.arguments.get("cache")
        record = self.capture.get(cache) if cache is not None and self.capture is not None else None
        if record is None or record.overflow:
            return self.mixer(*args, **kwargs)  # not recorded (or given up): the batched original
        x = bound.arguments[self.x_name]
        assert cache is not None  # a record exists only for a cache
        b, t = x.shape[:2]
        outs = []
        for i in range(t):
            # Slice every per-position argument ([B, T, ...]: hidden states,
            # RWKV7's v_first, [B, T] SSM masks); pass the rest unchanged.
            step = inspect.BoundArguments(
                self.signature,
                {name: v[:, i : i + 1] if _per_position(v, b, t) else v for name, v in bound.arguments.items()},
            )
            prior = list(cache.cache)
            outs.append(self.mixer(*step.args, **step.kwargs))
            record.record(cache, prior)
        return _join(outs)


@contextlib.contextmanager
def stepwise(sites: list[tuple[Any, Any, StepwiseMixer]], capture: StateCapture):
    """Put each wrapper in its mixer's place for the block, recording into `capture`; always put the mixers back.

    Args:
        sites: (parent, key, wrapper) with `parent[key] is wrapper.mixer` outside the block.
    """
    for parent, key, wrapper in sites:
        wrapper.capture = capture
        parent[key] = wrapper
    try:
        yield
    finally:
        for parent, key, wrapper in sites:
            parent[key] = wrapper.mixer
            wrapper.capture = None


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
