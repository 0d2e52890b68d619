"""Time the long-context verify curves while nothing else runs: between a chat's turns, between a server's
requests. A request never waits on this; it reads what was finished.

Contract: `refine_idle(engine, budget, should_stop)` times what `ContextCurve` still prices from the model
(context_curve.py), one unit of work at a time (one fill chunk or one forward), asking `should_stop()`
before each: it returns within one unit of being asked, and picks up where it left off on the next call.
Each length it finishes is merged into the file `context_curves` caches, and `curve.refresh()` makes the
next step read it. It fills a cache of its own and never touches a run's. Which lengths: once a request's
context passed FIRST_CONTEXT / 2, those of CONTEXTS up to the first one at or past the longest context the
curve was asked for, shortest first: ahead of the chat's growth, and never a 16k cache for short turns.

REPEATS matches calibration.py's rule (the fastest of a few timings); it is not a user's choice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator

import mlx.core as mx

from specpipe.costmodel import cache_file
from specpipe.costmodel.calibration import QUICK_POINTS, interpolate
from specpipe.costmodel.context_curve import (
    FIRST_CONTEXT,
    ContextCurve,
    cached_curves,
    context_lengths,
    curve_path,
    fill_steps,
)

REPEATS = 3  # timings per point; the fastest is kept (interference only ever adds time), as calibration does

Timing = Generator[None, None, dict]  # yields after each unit of work, returns {'t1_s', 'ratio'}


def refine_idle(
    engine,
    budget_or_curve,
    should_stop: Callable[[], bool],
    on_timed: Callable[[int, dict], None] | None = None,
) -> bool:
    """Time long-context curves until `should_stop()` says stop or none is left.

    Args:
        engine: the target the curve prices (the budget's).
        budget_or_curve: a session's budget (budget=auto's ContextCurve is refined; any other budget prices
            nothing by context, and nothing is done) or a ContextCurve.
        should_stop: asked before each unit of work (a fill chunk or one forward: under a second on SmolLM2
            at 16k positions); True means a request is waiting.
        on_timed: (cache length, {'t1_s', 'ratio'}) after each length is cached: the server logs what it timed.

    Returns:
        True when every wanted length is timed (the caller may stop calling), False when stopped early.
    """
    curve = _curve_of(budget_or_curve)
    if curve is None or engine is None:
        return True
    while not should_stop():
        if curve.refining is None:
            length = next_length(engine, curve)
            if length is None:
                return True
            curve.refining = (length, _timing(engine, length))
        length, work = curve.refining
        try:
            next(work)
        except StopIteration as done:
            curve.refining = None
            _save(engine, length, done.value)
            curve.refresh()
            if on_timed is not None:
                on_timed(length, done.value)
            mx.clear_cache()  # give the filled cache's memory back between requests
    return False


def _curve_of(budget_or_curve) -> ContextCurve | None:
    if isinstance(budget_or_curve, ContextCurve):
        return budget_or_curve
    return budget_or_curve.context_curve  # a Budget's (None: it does not price by cache length)


def next_length(engine, curve: ContextCurve) -> int | None:
    """The shortest wanted length not cached yet; None when all are (or the model holds no long context)."""
    if curve.longest < FIRST_CONTEXT // 2:
        return None  # short turns only: the short-context curve prices them
    timed = set(cached_curves(engine) or {})
    reach = max(curve.longest, FIRST_CONTEXT)
    wanted = []
    for length in context_lengths(engine):
        wanted.append(length)
        if length >= reach:
            break  # the next longer one is timed once a request comes near it
    return next((length for length in wanted if length not in timed), None)


def _timing(engine, length: int) -> Timing:
    """One length's curve, as `time_at_context` times it, paused after every fill chunk and every forward."""
    from mlx_lm.models.cache import trim_prompt_cache

    cache = engine.make_cache()
    yield from fill_steps(engine, cache, length)
    ids = mx.array([(7 * i) % 97 + 10 for i in range(max(QUICK_POINTS))], dtype=mx.uint32)
    mx.eval(engine.forward(ids[:4], cache).logits)  # warm-up: allocations, kernel selection
    trim_prompt_cache(cache, 4)
    yield
    fastest: dict[int, float] = {}
    for n in QUICK_POINTS:
        for _ in range(REPEATS):
            start = time.perf_counter()
            mx.eval(engine.forward(ids[:n], cache).logits)
            seconds = time.perf_counter() - start
            trim_prompt_cache(cache, n)
            fastest[n] = min(seconds, fastest.get(n, seconds))
            yield
    return {"t1_s": fastest[1], "ratio": interpolate(fastest)}


def _save(engine, length: int, timed: dict) -> None:
    """Merge one length's curve into the cached file (what another process cached stays)."""
    curves = cached_curves(engine) or {}
    curves[length] = timed
    cache_file.write(curve_path(engine), {str(c): v for c, v in sorted(curves.items())})
