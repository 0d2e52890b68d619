"""T(n)/T(1) at long context: what a verify over n tokens costs when the cache already holds
thousands of positions, interpolated by the cache's length.

Contract: `ContextCurve(engine).ratio_at(cache_len, base)` returns {n: T(n)/T(1)} for n = 1..33.
Below FIRST_CONTEXT it returns `base` (calibration.py's curve, timed after 128 cached positions)
unchanged; above, it interpolates linearly in the cache length between `base` and the curves
timed at CONTEXTS (the last one 64 positions short of the model's context), and holds the
longest one flat beyond it. Those curves are timed on first need (a few seconds to a minute) and
cached on disk beside the short-context calibration, keyed also by the KV policy (a quantized
cache prices attention differently). Timing needs no prefill: each attention layer's cache is
filled with random keys and values of the wanted length, because a forward's cost depends on how
many positions it attends to, not on what they hold. It never touches a run's cache.
"""

from __future__ import annotations

import json

import mlx.core as mx

from specpipe.costmodel.calibration import QUICK_POINTS, calibration_key, interpolate, time_on_cache
from specpipe.engine.load.model_store import cache_dir

FIRST_CONTEXT = 512  # below this the short-context calibration holds (it was timed at 128)
CONTEXTS = (1024, 4096, 8192, 16384)  # timed up to the model's context; the longest is held beyond
BUCKET = 256  # cache lengths within one bucket share a curve: the budget compares curves by identity


def fill_cache(engine, cache: list, length: int) -> None:
    """Bring every attention layer of `cache` to `length` positions of random keys and values.

    A one-token forward first allocates each layer (its shapes and dtype come from the model);
    recurrent layers keep that token's state, whose cost does not grow with the context.
    """
    mx.eval(engine.forward(mx.array([11], dtype=mx.uint32), cache).logits)
    for layer in cache:
        shapes = _kv_shapes(layer)
        if shapes is None:
            continue
        (heads_k, dim_k), (heads_v, dim_v), dtype = shapes
        done = layer.offset
        while done < length:  # in chunks, as a prefill grows it: one huge concatenate would double the peak
            n = min(2048, length - done)
            keys = (0.1 * mx.random.normal((1, heads_k, n, dim_k))).astype(dtype)
            values = (0.1 * mx.random.normal((1, heads_v, n, dim_v))).astype(dtype)
            layer.update_and_fetch(keys, values)
            mx.eval(layer.state)
            done += n


def _kv_shapes(layer):
    """((kv heads, key dim), (kv heads, value dim), dtype) of an attention cache layer; None otherwise."""
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if isinstance(keys, tuple) and isinstance(values, tuple):  # QuantizedKVCache: (packed, scales, biases)
        per_word = 32 // layer.bits
        return (
            (keys[0].shape[1], keys[0].shape[-1] * per_word),
            (values[0].shape[1], values[0].shape[-1] * per_word),
            mx.float32,
        )
    if isinstance(keys, mx.array) and isinstance(values, mx.array) and keys.ndim == 4:
        return (keys.shape[1], keys.shape[-1]), (values.shape[1], values.shape[-1]), keys.dtype
    return None


def time_at_context(engine, length: int, points=QUICK_POINTS, repeats: int = 3) -> dict[int, float]:
    """Fastest of `repeats` timings of one forward over n tokens after `length` cached positions."""
    cache = engine.make_cache()
    fill_cache(engine, cache, length)
    return time_on_cache(engine, cache, list(points), repeats)


def context_key(engine) -> str:
    """calibration_key plus the KV policy: keys quantized to 4 bits cost differently from float32 ones."""
    kv = engine.kv
    label = "full" if kv is None else kv.name + "".join(f"{getattr(kv, a)}" for a in ("bits", "size") if hasattr(kv, a))
    return f"{calibration_key(engine)}-ctx-{label}"


def context_curves(engine, refresh: bool = False) -> dict[int, dict]:
    """{cache length: {'t1_s': seconds, 'ratio': {n: T(n)/T(1)}}} at each of CONTEXTS the model holds,
    timed once per device and cached."""
    path = cache_dir() / "calibration" / f"{context_key(engine)}.json"
    if path.exists() and not refresh:
        data = json.loads(path.read_text())
        return {
            int(c): {"t1_s": v["t1_s"], "ratio": {int(n): r for n, r in v["ratio"].items()}} for c, v in data.items()
        }
    limit = engine.context_length or max(CONTEXTS)
    curves = {}
    # room for the timed tokens (up to 33) inside the context: 8192 is timed at 8128 on an 8k model
    for length in sorted({min(c, limit - 64) for c in CONTEXTS if c > FIRST_CONTEXT and limit - 64 > FIRST_CONTEXT}):
        measured = time_at_context(engine, length)
        curves[length] = {"t1_s": measured[1], "ratio": interpolate(measured)}
        mx.clear_cache()  # give the filled cache's memory back before the next, longer one
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(curves, indent=2))
    return curves


class ContextCurve:
    """The verify cost curve at a cache length: `base` below FIRST_CONTEXT, interpolated above."""

    def __init__(self, engine):
        self.engine = engine
        self._curves: dict[int, dict] | None = None  # timed on the first long context
        self._base: dict[int, float] | None = None
        self._by_bucket: dict[int, dict[int, float]] = {}

    def ratio_at(self, cache_len: int, base: dict[int, float]) -> dict[int, float]:
        """{n: T(n)/T(1)} after `cache_len` cached positions: `base` itself (the short-context curve) below
        FIRST_CONTEXT, else one object per BUCKET of lengths, so a caller can tell a change by identity."""
        if cache_len < FIRST_CONTEXT:
            return base
        if base is not self._base:  # a new calibration: the interpolations made from the old one are stale
            self._base, self._by_bucket = base, {}
        bucket = cache_len // BUCKET
        if bucket not in self._by_bucket:
            self._by_bucket[bucket] = self._interpolated(bucket * BUCKET, base)
        return self._by_bucket[bucket]

    def _interpolated(self, length: int, base: dict[int, float]) -> dict[int, float]:
        if self._curves is None:
            self._curves = context_curves(self.engine)
        points = {128: base, **{c: v["ratio"] for c, v in self._curves.items()}}
        xs = sorted(points)
        if length >= xs[-1]:
            return dict(points[xs[-1]])
        hi = next(x for x in xs if x >= length)
        lo = max(x for x in xs if x <= length)
        w = 0.0 if hi == lo else (length - lo) / (hi - lo)
        return {n: points[lo][n] + w * (points[hi][n] - points[lo][n]) for n in base}
