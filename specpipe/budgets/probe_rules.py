"""Two of budget=auto's sizing rules, apart from the policy that applies them (budgets/policy.py): whether a probe
can repay its expected loss within a short answer, and whether a thin continuation is worth one token more.

Contract: pure functions of the rates and the cost model's figures; they read no budget state and decide nothing
else. PROBE_HOPE is not a user's choice: it is the least saving a probe is bought to look for (its job is to
notice text that changed, which no measured rate predicts).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from specpipe.budgets.rates import THIN_TRIALS, optimistic
from specpipe.costmodel.calibration import expected_speedup

# a probe hopes to find at least this saving per later token, even where the optimistic rates promise none: what
# `repays` weighs a probe's loss against over the answer's rest
PROBE_HOPE = 0.05


def repays(k: int, rates, c: float, ratio: dict[int, float], expected_left: float, best: Callable[..., int]) -> bool:
    """A probe of k tokens can repay its expected loss within the answer's expected remaining tokens: the loss is
    its price (c k + T(k + 1)/T(1) steps) less the tokens the point rates expect of it; the gain, should the
    optimistic rates be right, the rest of the answer at their speed-up (at least PROBE_HOPE). `best(alpha, g)`:
    the K the policy would draft at those rates.

    Example (c 0.3, flat verify 1.1, alpha 0.3, g 0.3, optimistic speed-up 1.3): k 2 costs 1.7 steps and yields
    1.39 tokens, a loss of 0.31 steps; each later token would save 1 - 1/1.3 = 0.23, so the answer must have
    2 + 1 + 0.31 / 0.23 = 4.3 tokens left.
    """
    if k <= 0 or math.isinf(expected_left):
        return True
    a, g = rates.alpha, rates.continuation
    tokens = 1.0 + a * (k if g >= 1.0 else (1 - g**k) / (1 - g))
    loss = c * k + ratio[min(k + 1, max(ratio))] - tokens
    if loss <= 0:
        return True
    hopeful = (rates.alpha_optimistic, rates.continuation_optimistic)
    top = expected_speedup(hopeful[0], best(*hopeful), c, ratio, hopeful[1])
    gain = max(0.0, expected_left - k - 1) * max(PROBE_HOPE, 1.0 - 1.0 / top)
    return gain >= loss


def longer(k: int, alpha: float, g: float, nxt: list[float], c: float, ratio, explore_cost: float, k_max: int) -> int:
    """k + 1 where a continuation `nxt` of under THIN_TRIALS trials pays better at its optimistic value and the
    point rates price k + 1 within `explore_cost` of k's (and above plain); else k. One token further, not to
    the optimistic peak: a held token thickens the evidence, a long draft lost costs steps. Thicker evidence is
    not explored."""
    hopeful = optimistic(nxt)
    if k == 0 or sum(nxt) >= THIN_TRIALS or hopeful <= g:
        return k
    floor = max(1.0, explore_cost * expected_speedup(alpha, k, c, ratio, g))
    near = [m for m in range(1, k_max + 1) if expected_speedup(alpha, m, c, ratio, g) >= floor]
    hoped = {m: expected_speedup(alpha, m, c, ratio, hopeful) for m in near}
    return max(k, min(k + 1, max(hoped, key=lambda m: (hoped[m], -m))))
