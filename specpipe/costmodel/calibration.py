"""Measure what a forward over n tokens costs on this device, T(n)/T(1),
cache it, and predict which draft budget pays.

Contract: `verify_cost_curve(engine)` returns {n: T(n)/T(1)} for n = 1..33
(measured points, linearly interpolated between them), cached under
`<specpipe cache>/calibration/` keyed by model hash, precision, device and
BLAS. A timing is checked before it is saved (curve_guard.py): an impossible or
too noisy one is timed again (ATTEMPTS in all), then discarded with one notice (planned from
the cached curve, else from itself made non-decreasing, in memory only); the
cache keeps the better-conditioned of the cached and the new curve.
`specpipe-calibrate` prints the curve and the predicted speed-up per K at several
acceptance rates and saves a PNG plot.

The constants (the points timed, the context they are timed at, samples per point, attempts) say how a
timing is taken, not a user's choice: they trade a curve's noise against the seconds it costs once per device
(`budget.quick` picks the 7-point or the 33-point set).
"""

from __future__ import annotations

import hashlib
import sys
import time

import mlx.core as mx

from specpipe.costmodel import cache_file, curve_guard
from specpipe.engine.load.model_store import cache_dir

FULL_POINTS = list(range(1, 34))
QUICK_POINTS = [1, 2, 3, 5, 9, 17, 33]
CONTEXT = 128  # cache length the timings are taken at: a typical mid-answer position
SAMPLE_S = 0.03  # seconds of one-token forwards a point's samples should add up to, at least `repeats` of them
MAX_REPEATS = 25
ATTEMPTS = 3  # timings of a curve before one that keeps failing its checks is given up (not saved)


def calibration_key(engine) -> str:
    from specpipe.engine.device import device

    dev = device()
    # the name too: a layer-skip view shares the target's file hash but not its cost
    name = hashlib.sha256(engine.info.name.encode()).hexdigest()[:8]
    # v3: samples round-robin over the points and checked before saving (curve_guard); v2's unchecked curves
    # include impossible ones (T(5)/T(1) = 0.92), so they are not read
    parts = ["v3", engine.info.sha256[:16], name, engine.info.precision, dev.get("mlx_device", ""), dev.get("blas", "")]
    if dev.get("blas_threads"):  # OpenBLAS with one thread and with two have different curves (T(17)/T(1) 1.80 vs 1.67)
        parts.append(f"t{dev['blas_threads']}")
    return "-".join(
        p.replace(" ", "").replace("(", "").replace(")", "").replace(",", "_").replace("/", "_") for p in parts
    )


def time_forwards(
    engine, points: list[int], repeats: int = 3, samples: dict[int, list[float]] | None = None
) -> dict[int, float]:
    """Fastest of `repeats` timings of one forward over n tokens, after CONTEXT cached tokens."""
    cache = engine.make_cache()
    engine.prefill(list(range(10, 10 + CONTEXT)), cache)
    return time_on_cache(engine, cache, points, repeats, samples)


def time_on_cache(
    engine, cache, points: list[int], repeats: int = 3, samples: dict[int, list[float]] | None = None
) -> dict[int, float]:
    """Fastest of `repeats` timings of one forward over n tokens on a filled `cache` (left as it was); every
    sample into `samples` when given (their spread is the timing's noise)."""
    from mlx_lm.models.cache import trim_prompt_cache

    ids = mx.array([(7 * i) % 97 + 10 for i in range(max(points))], dtype=mx.uint32)
    mx.eval(engine.forward(ids[:4], cache).logits)  # warm-up: allocations, kernel selection
    trim_prompt_cache(cache, 4)
    one = []
    for _ in range(3):
        start = time.perf_counter()
        mx.eval(engine.forward(ids[:1], cache).logits)
        one.append(time.perf_counter() - start)
        trim_prompt_cache(cache, 1)
    # a forward of a millisecond is at the mercy of the scheduler: take more samples of it (timeit's autorange)
    repeats = max(repeats, min(MAX_REPEATS, int(SAMPLE_S / max(min(one), 1e-6))))
    taken: dict[int, list[float]] = {n: [] for n in points}
    # round-robin over the points: a burst of load from another process lands on one sample of several points,
    # not on every sample of one (which would bend the curve wherever it fell)
    for _ in range(repeats):
        for n in points:
            start = time.perf_counter()
            mx.eval(engine.forward(ids[:n], cache).logits)
            taken[n].append(time.perf_counter() - start)
            trim_prompt_cache(cache, n)
    if samples is not None:
        samples.update(taken)
    # the fastest sample: interference from other processes only ever adds time (timeit's rule)
    return {n: min(t) for n, t in taken.items()}


def interpolate(measured: dict[int, float], points=FULL_POINTS) -> dict[int, float]:
    """Ratios T(n)/T(1) at every n, linear between measured points."""
    xs = sorted(measured)
    t1 = measured[1]
    curve = {}
    for n in points:
        hi = next(x for x in xs if x >= n) if n <= xs[-1] else xs[-1]
        lo = max(x for x in xs if x <= n) if n >= xs[0] else xs[0]
        t = measured[lo] if hi == lo else measured[lo] + (measured[hi] - measured[lo]) * (n - lo) / (hi - lo)
        curve[n] = t / t1
    return curve


def verify_cost_curve(engine, quick: bool = True, refresh: bool = False) -> dict:
    """{'t1_s': seconds, 'ratio': {n: T(n)/T(1)}, 'measured': {...}, 'noise': ...}, from cache when possible.

    `refresh` times the curve again even when one is cached; the cache still keeps the better-conditioned one.
    """
    path = cache_dir() / "calibration" / f"{calibration_key(engine)}.json"
    cached = cache_file.read(path, _check_curve)
    if cached is not None:
        cached["ratio"] = {int(k): float(v) for k, v in cached["ratio"].items()}
    usable = cached if cached is not None and (quick or cached.get("full")) else None
    if usable is not None and not refresh:
        return usable
    points = QUICK_POINTS if quick else FULL_POINTS
    for _ in range(ATTEMPTS):  # a curve that fails its checks is timed again: a burst of load passes
        samples: dict[int, list[float]] = {}
        measured = time_forwards(engine, points, repeats=3, samples=samples)
        bad = curve_guard.problems(measured, samples)
        if not bad:
            break
    data = {
        "model": engine.info.name,
        "precision": engine.info.precision,
        "full": not quick,
        "t1_s": measured[1],
        "measured": measured,
        "ratio": interpolate(measured),
        "noise": curve_guard.noise(samples),
    }
    if bad:
        fallback = "the cached curve" if usable is not None else "it made non-decreasing, this run only"
        print(
            f"specpipe: the verify curve timed just now failed {ATTEMPTS} times ({bad[0]}); "
            f"not saved, planning from {fallback}",
            file=sys.stderr,
        )
        if usable is not None:
            return usable
        data["ratio"] = curve_guard.monotone(data["ratio"])
        return data
    if usable is not None and curve_guard.keep_cached(usable, data):
        return usable  # timed with less noise than this one: the cache keeps it
    cache_file.write(path, data)
    return data


def _check_curve(data: dict) -> None:
    """A usable cached curve: t1_s and a plausible ratio at 1 .. 33 (a torn or older file, or one saved before
    curves were checked with an impossible T(n)/T(1), has not)."""
    float(data["t1_s"])
    ratio = {int(k): float(v) for k, v in data["ratio"].items()}
    if set(ratio) != set(FULL_POINTS) or ratio[1] != 1.0:
        raise ValueError(f"ratio at {sorted(ratio)[:3]}...; want 1..{FULL_POINTS[-1]}")
    seconds = {int(k): float(v) for k, v in (data.get("measured") or {}).items()}
    bad = curve_guard.problems(seconds) if 1 in seconds else curve_guard.problems(ratio, jitter=0.0)
    if bad:
        raise ValueError(bad[0])


def expected_speedup(
    alpha: float, k: int, c: float, ratio: dict[int, float], continuation: float | None = None
) -> float:
    """Tokens per unit time relative to plain decoding (Leviathan et al.'s model).

    The first drafted token is accepted with probability alpha and each later
    one, given the one before it was, with `continuation` (default alpha: the
    geometric model, (1 - alpha^(k+1)) / (1 - alpha) tokens). A step drafting
    k tokens yields 1 + alpha (1 - g^k) / (1 - g) tokens (g = continuation)
    and costs k·c + T(k+1)/T(1) (the verify forward scores k+1 positions).
    k = 0 is plain decoding: 1.0.
    """
    if k == 0:
        return 1.0
    g = alpha if continuation is None else continuation
    tokens = 1 + alpha * (k if g >= 1.0 else (1 - g**k) / (1 - g))
    return tokens / (k * c + ratio[min(k + 1, max(ratio))])


def draft_prefill_cost(drafter, target, quick: bool = True) -> float:
    """One prompt token of the drafter's own prefill, in target steps (0 for a drafter without a model).

    Read off the draft model's calibrated curve at its longest point: T_d(n) / n over the target's T(1). A
    prefill in 512-token chunks runs cheaper per token than a 33-token forward, so this prices the prefill
    high rather than low: a window or no prefill is chosen only where it clearly pays.
    """
    engine = drafter.engine
    if engine is None:
        return 0.0
    curve = verify_cost_curve(engine, quick)
    n = max(curve["ratio"])
    per_token = curve["ratio"][n] / n
    if engine is target:
        return per_token
    return per_token * curve["t1_s"] / verify_cost_curve(target, quick)["t1_s"]


def draft_cost(drafter, target, quick: bool = True) -> float:
    """c: one drafted token's cost relative to one target forward (0 for model-free drafters).

    A drafter that runs part of the target (an MTP head, a layer subset) says
    so with `cost_per_token`: decoding one token is bound by the weight bytes
    it reads, so its share of the target's bytes is its share of a step. A
    draft model's timed forward is scaled by its `bytes_share` (a cut head).
    """
    hint = drafter.cost_per_token
    if hint is not None:
        return float(hint)
    engine = drafter.engine
    if engine is None:
        return 0.0
    if engine is target:
        return 1.0  # draft.model=self: a full target forward per drafted token
    # a cut draft head (draft.vocab) reads fewer bytes than the full forward timed here
    return drafter.bytes_share * verify_cost_curve(engine, quick)["t1_s"] / verify_cost_curve(target, quick)["t1_s"]
