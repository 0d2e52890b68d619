"""T(n)/T(1) at long context: what a verify over n tokens costs when the cache already holds
thousands of positions, interpolated by the cache's length.

Contract: `ContextCurve(engine).ratio_at(cache_len, base)` returns {n: T(n)/T(1)} for n = 1..33
and never times anything (it runs on a request's path). Below FIRST_CONTEXT it returns `base`
(calibration.py's curve, timed after 128 cached positions) unchanged; above, it interpolates
linearly in the cache length between `base` and the curves timed at CONTEXTS (the last one 64
positions short of the model's context) where `specpipe-calibrate` or an idle refinement (refine.py)
cached them; past the longest one cached it grows from it by a context-length model, as it does from
`base` where none are cached (the model, `context_cost`: each cached position costs its KV bytes
against the weights' bytes, per query a share of that); `source` says "modelled" there, so the step's
decision can say so. `context_curves`
times and caches the curves (specpipe-calibrate, off any request). Timing needs no prefill: each
attention layer's cache is filled with random keys and values of the wanted length, because a
forward's cost depends on how many positions it attends to, not on what they hold. It never
touches a run's cache.

The constants (the lengths timed, the bucket a curve is shared over, the context-length model's read
coefficients) are properties of the cost model, not a user's choice: a run reads the curves, it never tunes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx

from specpipe.costmodel import cache_file
from specpipe.costmodel.calibration import CONTEXT, QUICK_POINTS, calibration_key, interpolate, time_on_cache
from specpipe.engine.load.model_store import cache_dir

FIRST_CONTEXT = 512  # below this the short-context calibration holds (it was timed at 128)
CONTEXTS = (1024, 4096, 8192, 16384)  # timed up to the model's context; the longest is held beyond
BUCKET = 256  # cache lengths within one bucket share a curve: the budget compares curves by identity
# The context-length model, fitted where both were timed (SmolLM2, OpenBLAS, 1k-8k: docs/benchmarks.md): one
# cached position costs 1.55x its KV bytes' share of the weight bytes per forward (attention reads it less
# smoothly than a GEMM streams weights) and 0.6x per query token on top. Here 1.5 and 0.8: a verify priced a
# little dearer than measured (T(17)/T(1) 2.8 for 2.4 at 1k), so an untimed context drafts shorter, never longer.
READ_PER_POSITION = 1.5
READ_PER_QUERY = 0.8


def fill_cache(engine, cache: list, length: int) -> None:
    """Bring every attention layer of `cache` to `length` positions of random keys and values.

    A one-token forward first allocates each layer (its shapes and dtype come from the model);
    recurrent layers keep that token's state, whose cost does not grow with the context.
    """
    for _ in fill_steps(engine, cache, length):
        pass


def fill_steps(engine, cache: list, length: int) -> Iterator[None]:
    """`fill_cache` one chunk at a time: yields after each, so an idle refinement (refine.py) can stop."""
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
            yield


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


def cached_curves(engine) -> dict[int, dict] | None:
    """The long-context curves `context_curves` cached for this engine, or None (nothing timed, or a
    torn / stale file: one notice line). Reads a file; never times."""
    data = cache_file.read(curve_path(engine), _decoded)
    return _decoded(data) if data is not None else None


def context_curves(engine, refresh: bool = False) -> dict[int, dict]:
    """{cache length: {'t1_s': seconds, 'ratio': {n: T(n)/T(1)}}} at each of CONTEXTS the model holds,
    timed once per device and cached. A few seconds to minutes: never call it on a request's path."""
    cached = None if refresh else cached_curves(engine)
    if cached is not None:
        return cached
    curves = {}
    for length in context_lengths(engine):
        measured = time_at_context(engine, length)
        curves[length] = {"t1_s": measured[1], "ratio": interpolate(measured)}
        mx.clear_cache()  # give the filled cache's memory back before the next, longer one
    cache_file.write(curve_path(engine), {str(c): v for c, v in curves.items()})
    return curves


def context_lengths(engine) -> list[int]:
    """The cache lengths a curve is timed at for this model, shortest first: CONTEXTS within its context,
    leaving room for the timed tokens (up to 33): 8192 is timed at 8128 on an 8k model."""
    limit = engine.context_length or max(CONTEXTS)
    return sorted({min(c, limit - 64) for c in CONTEXTS if c > FIRST_CONTEXT and limit - 64 > FIRST_CONTEXT})


def curve_path(engine):
    """The cache file of this engine's long-context curves."""
    return cache_dir() / "calibration" / f"{context_key(engine)}.json"


def _decoded(data: dict) -> dict[int, dict]:
    """The cached file's curves with integer keys; KeyError / ValueError on a file of another layout."""
    curves: dict[int, dict] = {
        int(c): {"t1_s": float(v["t1_s"]), "ratio": {int(n): float(r) for n, r in v["ratio"].items()}}
        for c, v in data.items()
    }
    if any(set(v["ratio"]) != set(range(1, 34)) for v in curves.values()):
        raise ValueError("a curve without every n in 1..33")
    return curves


def context_cost(engine) -> tuple[float, float] | None:
    """(a, b): one more cached position adds a + b·n to a forward over n tokens, in units of T(1) at the
    short context (the context-length model; None where the model's geometry cannot be read).

    A decode step reads the weights once, so T(1) ~ weight bytes; attending over one cached position reads
    its keys and values (KV bytes) once per forward plus a share per query token. SmolLM2 (30 layers, 3 KV
    heads of 64, float32): 46 KB per position against 538 MB of weights, a = 1.3e-4, b = 6.9e-5."""
    from specpipe.costmodel.weights import weight_bytes

    args: Any = getattr(engine.model, "args", None)
    try:
        layers = int(args.num_hidden_layers)
        heads = int(args.num_attention_heads)
        kv_heads = int(getattr(args, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(args, "head_dim", None) or args.hidden_size // heads)
        weights = weight_bytes(engine.model)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None
    bits = getattr(engine.kv, "bits", None) or (16 if engine.info.precision in ("bfloat16", "float16") else 32)
    per_position = 2 * layers * kv_heads * head_dim * bits / 8
    if weights <= 0:
        return None
    share = per_position / weights
    return READ_PER_POSITION * share, READ_PER_QUERY * share


def modelled(base: dict[int, float], length: int, cost: tuple[float, float]) -> dict[int, float]:
    """T(n)/T(1) after `length` cached positions from the short-context curve and the context-length model.

    Example: base T(17)/T(1) = 1.9, a = 1.3e-4, b = 6.9e-5, length 1024 (896 past the calibration's 128):
    T(1) = 1 + 896 (a + b) = 1.18, T(17) = 1.9 + 896 (a + 17 b) = 3.07, ratio 2.6."""
    a, b = cost
    extra = max(0, length - CONTEXT)
    t1 = 1.0 + extra * (a + b)
    return {n: (r + extra * (a + b * n)) / t1 for n, r in base.items()}


class ContextCurve:
    """The verify cost curve at a cache length: `base` below FIRST_CONTEXT, interpolated above (between
    timed curves where specpipe-calibrate cached them, else modelled). Never times anything."""

    def __init__(self, engine):
        self.engine = engine
        self._curves: dict[int, dict] | None = None  # read from the cache on the first long context
        self._read = engine is None  # a curve without an engine (tests) has only what it is given
        self._base: dict[int, float] | None = None
        self._by_bucket: dict[int, dict[int, float]] = {}
        self.source = ""  # of the last ratio_at: "" (base), "timed" (cached curves) or "modelled"
        self.longest = 0  # the longest cache length asked for: what an idle refinement (refine.py) times up to
        self.refining: tuple[int, Any] | None = None  # refine.py's length in progress and its paused timing

    def ratio_at(self, cache_len: int, base: dict[int, float]) -> dict[int, float]:
        """{n: T(n)/T(1)} after `cache_len` cached positions: `base` itself (the short-context curve) below
        FIRST_CONTEXT, else one object per BUCKET of lengths, so a caller can tell a change by identity."""
        self.longest = max(self.longest, cache_len)
        if cache_len < FIRST_CONTEXT:
            self.source = ""
            return base
        if base is not self._base:  # a new calibration: the interpolations made from the old one are stale
            self._base, self._by_bucket = base, {}
        if not self._read:
            self._curves, self._read = cached_curves(self.engine), True
        bucket = cache_len // BUCKET
        # past the longest timed length the curve grows by the model from it (_interpolated): modelled too
        self.source = "timed" if self._curves and bucket * BUCKET <= max(self._curves) else "modelled"
        if bucket not in self._by_bucket:
            self._by_bucket[bucket] = self._interpolated(bucket * BUCKET, base)
        return self._by_bucket[bucket]

    def refresh(self) -> None:
        """Read the cache again (specpipe-calibrate, or a refinement between requests, timed new curves)."""
        self._read, self._by_bucket = self.engine is None, {}

    def _interpolated(self, length: int, base: dict[int, float]) -> dict[int, float]:
        cost = context_cost(self.engine) if self.engine is not None else None
        if not self._curves:
            return modelled(base, length, cost) if cost is not None else dict(base)
        points = {CONTEXT: base, **{c: v["ratio"] for c, v in self._curves.items()}}
        xs = sorted(points)
        if length >= xs[-1]:
            # past the longest timing (an idle refinement times the short ones first): the context-length
            # model's growth from it; without one (no engine), held flat
            last = xs[-1]
            return modelled(points[last], CONTEXT + length - last, cost) if cost is not None else dict(points[last])
        hi = next(x for x in xs if x >= length)
        lo = max(x for x in xs if x <= length)
        w = 0.0 if hi == lo else (length - lo) / (hi - lo)
        return {n: points[lo][n] + w * (points[hi][n] - points[lo][n]) for n in base}
