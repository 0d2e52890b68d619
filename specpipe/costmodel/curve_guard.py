"""Checks on a timed verify curve before it is cached, and the choice between it and the curve already cached.

Contract: `problems(measured, samples)` names what makes a timing of T(n) impossible or too noisy to plan from:
T(n)/T(1) below 1 for n > 1, T falling as n grows, or repeats spread past MAX_SPREAD, each beyond NOISE.
Timings within NOISE or JITTER_S of each other are equal. `noise(samples)` is a timing's conditioning (0 on a
quiet machine); `keep_cached(cached, new)` says whether the
cached curve is the better-conditioned one; `monotone(ratio)` is the curve a failed timing is still planned from
in memory (never saved). Nothing here times or writes anything.

NOISE, MAX_SPREAD and JITTER_S describe a timer on a shared machine, not a user's choice.
"""

from __future__ import annotations

import statistics

NOISE = 0.05  # timings within 5% are equal: what the fastest of 3 samples still varies by on a busy machine
MAX_SPREAD = 0.5  # the typical point's fastest samples 1.5x apart: the machine was too busy to time
JITTER_S = 0.0003  # scheduler jitter: a tiny model's millisecond forwards differ by this much on any machine


def noise(samples: dict[int, list[float]]) -> float:
    """How reproducible each point's fastest sample is: the median over points of (the lower quartile's sample,
    at least the second fastest, less JITTER_S) / the fastest - 1, at least 0. A busy machine's slow samples
    above that quartile do not count: the curve is built from the fastest ones.
    Example: {1: [0.0100, 0.0113, 0.0500]} -> 0.1 (the second fastest, 1.3 ms less the jitter, over 10 ms)."""
    spreads = []
    for taken in samples.values():
        if len(taken) < 2 or min(taken) <= 0:
            continue
        ordered = sorted(taken)
        near = ordered[max(1, len(ordered) // 4)]
        spreads.append(max(0.0, near - ordered[0] - JITTER_S) / ordered[0])
    return statistics.median(spreads) if spreads else 0.0


def problems(
    measured: dict[int, float], samples: dict[int, list[float]] | None = None, jitter: float = JITTER_S
) -> list[str]:
    """What is wrong with a timing {n: seconds of one forward over n tokens}; [] when plausible. A ratio curve
    (no seconds) is checked with jitter=0.

    Example: {1: 1.0, 5: 0.92} -> ["T(5)/T(1) = 0.92: a forward over 5 tokens cannot be faster than over 1"].
    """
    found = []
    points = sorted(measured)
    t1 = measured[points[0]]
    peak_n, peak = points[0], t1

    def below(t: float, than: float) -> bool:
        return t < than - max(NOISE * than, jitter)

    for n in points[1:]:
        t = measured[n]
        if below(t, t1):
            found.append(f"T({n})/T(1) = {t / t1:.2f}: a forward over {n} tokens cannot be faster than over 1")
        elif below(t, peak):
            found.append(f"T({n}) = {t / peak:.2f} x T({peak_n}): the curve falls as the forward grows")
        if t > peak:
            peak_n, peak = n, t
    spread = noise(samples or {})
    if spread > MAX_SPREAD:
        found.append(f"its repeats spread {spread:.0%} (bound {MAX_SPREAD:.0%}): the machine was too busy")
    return found


def monotone(ratio: dict[int, float]) -> dict[int, float]:
    """The curve made >= 1 and non-decreasing (each point the largest so far): {1: 1, 2: 0.9, 3: 1.2} -> 1, 1, 1.2."""
    out, top = {}, 1.0
    for n in sorted(ratio):
        top = max(top, ratio[n])
        out[n] = top
    return out


def keep_cached(cached: dict | None, new: dict) -> bool:
    """True when the cached curve was timed with less noise than `new` (a curve without a noise figure loses)."""
    if cached is None or "noise" not in cached:
        return False
    return float(cached["noise"]) <= float(new.get("noise", 0.0))
