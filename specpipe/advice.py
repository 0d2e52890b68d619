"""One-line warnings at the start of a run whose setting the cost model predicts slower than plain decoding.

Checked once, from what the session already holds (no timing): the device, the target's precision, the
drafter's cost per drafted token and the budget's K.
- A quantized or half-precision target on CPU: MLX's CPU quantized / half matmuls do not use BLAS, so a
  verify over K + 1 tokens costs about K + 1 plain steps (engine/load/build.py auto_precision); no draft
  can pay for that, while float32 goes through BLAS.
- A drafter that runs part of the target (draft=layerskip, draft=mtp; cost_per_token ~ its share of the
  target's weight bytes) at a fixed K the cost model prices slower than plain at budget=auto's prior
  acceptance (conf/budget/auto.yaml prior_alpha, 50%), the acceptance it assumes before any draft is seen.
  Requiring a loss even at full acceptance (K·c + T(K+1)/T(1) >= K + 1) almost never fired: a 12-of-30
  layer draft costs ~0.5 of a step per token, 5.7 steps for K = 8 against 9 tokens at best, yet it accepts
  2-9% (docs/benchmarks/log/2026-12-06-drafters-sittings.md) and runs at ~0.2x. The line says the acceptance
  the setting needs, so a drafter that does reach it (an early exit trained for it) knows the warning does not
  apply.
- A draft model with another tokenizer that shares few of the target's token ids (a token map:
  drafters/cross_vocab.py): its drafts rarely line up with the target's tokens, so most are rejected.
"""

from __future__ import annotations

# Below this share of the target's token ids a token-mapped draft is warned about. Ids, not the corpus
# coverage auto judges by: a byte-level draft's 238 single-byte tokens cover 26% of SmolLM2's corpus tokens
# (spaces, punctuation) yet drafted 0% accepted; two BPE families (SmolLM2 and Qwen2.5) share tens of
# thousands of ids, far above this.
FEW_SHARED_IDS = 0.05


def few_shared_tokens(drafter) -> str:
    """The warning for a draft model mapped onto the target's tokens through few shared ids, else ""."""
    from specpipe.drafters.model import ModelDrafter  # the one drafter with a token map

    cross = drafter.token_map if isinstance(drafter, ModelDrafter) else None
    if cross is None:
        return ""
    rows = cross.vmap.target_rows
    share = cross.shared / rows if rows else 0.0
    if share >= FEW_SHARED_IDS:
        return ""
    return (
        f"the draft shares {cross.shared} of the target's {rows} token ids ({share:.1%}; token map "
        f"draft.vocab_map={cross.method}): expect few accepted drafts; use a draft model of the target's family"
    )


def slow_on_cpu(mlx_device: str, precision: str) -> str:
    """The warning for a target precision that verifies at ~K x one token's cost on this device, else ""."""
    if "cpu" not in mlx_device.lower() or precision in ("", "float32"):
        return ""
    return (
        f"target precision {precision} on CPU verifies K tokens at ~K x one token's cost (MLX's CPU quantized "
        "and half matmuls skip BLAS): speculation will not pay; quant=auto (float32) is faster here"
    )


def draft_cannot_pay(
    name: str, c: float | None, k: int, ratio: dict[int, float] | None, prior: float | None = None
) -> str:
    """The warning for a drafter whose fixed K the cost model prices slower than plain decoding, else "".

    Slower at `prior` acceptance (budget=auto's prior_alpha by default): the line gives the acceptance K needs
    to pay, and a smaller K that pays at the prior where one does. Slower even at full acceptance (K drafted
    tokens cost more than the K + 1 they can yield): said so. `ratio` is T(n)/T(1) (a cached calibration);
    without one, a verify is priced as one plain step, the cheapest it can be.

    Example (SmolLM2, draft.depth=12: c = 0.53; T(9)/T(1) = 1.5): K = 8 costs 8 x 0.53 + 1.5 = 5.7 plain
    steps; at 50% acceptance a step yields 1 + (1 - 0.5^8) = 2.0 tokens: 0.35x; it pays from ~88% on.
    """
    from specpipe.costmodel.calibration import expected_speedup

    if c is None or c <= 0 or k <= 0:
        return ""
    prior = default_prior() if prior is None else prior
    curve = ratio or {1: 1.0}  # no calibration: every verify priced as one step (never a false alarm from it)
    at_prior = expected_speedup(prior, k, c, curve)
    if at_prior >= 1.0:
        return ""
    cost = k * c + curve[min(k + 1, max(curve))]
    head = f"draft={name} costs {c:.2f} of a plain step per drafted token: budget.k={k} costs {cost:.1f} plain steps"
    if expected_speedup(1.0, k, c, curve) < 1.0:
        return (
            f"{head} for at most {k + 1} tokens, slower than plain even if every draft is accepted; use a shallower "
            "draft or budget=auto (which falls back to plain)"
        )
    need = break_even(k, c, curve)
    smaller = max(range(1, k), key=lambda j: expected_speedup(prior, j, c, curve), default=0)
    gain = expected_speedup(prior, smaller, c, curve) if smaller else 0.0
    instead = f"budget.k={smaller} ({gain:.2f}x at {prior:.0%}), " if gain > 1.0 else ""
    return (
        f"{head}, so it pays only if the target accepts over {need:.0%} of drafted tokens (predicted {at_prior:.2f}x "
        f"plain at {prior:.0%}, budget=auto's prior); use {instead}a shallower draft or budget=auto (which falls "
        "back to plain)"
    )


def break_even(k: int, c: float, ratio: dict[int, float]) -> float:
    """The per-token acceptance at which K drafted tokens pay exactly (expected_speedup rises with it)."""
    from specpipe.costmodel.calibration import expected_speedup

    lo, hi = 0.0, 1.0
    for _ in range(30):  # bisection to ~1e-9: the speed-up is monotone in the acceptance
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_speedup(mid, k, c, ratio) < 1.0 else (lo, mid)
    return hi


def default_prior() -> float:
    """budget=auto's prior acceptance, read from its packaged YAML (one source for the figure)."""
    from specpipe.config.config_groups import group_option

    return float(group_option("budget", "auto")["prior_alpha"])


def warnings(target, drafter, budget, mlx_device: str) -> list[str]:
    """Every warning that applies to this session (each one line, without the `specpipe: warning: ` prefix)."""
    from specpipe.budgets.fixed import FixedBudget
    from specpipe.costmodel.worth import cached_ratio

    out = [slow_on_cpu(mlx_device, target.info.precision), few_shared_tokens(drafter)]
    if not out[0] and isinstance(budget, FixedBudget):  # budget=auto falls back to plain by itself
        out.append(draft_cannot_pay(drafter.name, drafter.cost_per_token, budget.k, cached_ratio(target)))
    return [w for w in out if w]
