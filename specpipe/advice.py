"""One-line warnings at the start of a run whose setting the cost model predicts slower than plain decoding.

Checked once, from what the session already holds (no timing): the device, the target's precision, the
drafter's cost per drafted token and the budget's K.
- A quantized or half-precision target on CPU: MLX's CPU quantized / half matmuls do not use BLAS, so a
  verify over K + 1 tokens costs about K + 1 plain steps (engine/load/build.py auto_precision); no draft
  can pay for that, while float32 goes through BLAS.
- A drafter that runs part of the target (draft=layerskip; cost_per_token ~ its share of the target's
  weight bytes) at a K where K·c + T(K+1)/T(1) >= K + 1: slower than plain even if every draft is accepted.
"""

from __future__ import annotations


def slow_on_cpu(mlx_device: str, precision: str) -> str:
    """The warning for a target precision that verifies at ~K x one token's cost on this device, else ""."""
    if "cpu" not in mlx_device.lower() or precision in ("", "float32"):
        return ""
    return (
        f"target precision {precision} on CPU verifies K tokens at ~K x one token's cost (MLX's CPU quantized "
        "and half matmuls skip BLAS): speculation will not pay; quant=auto (float32) is faster here"
    )


def draft_cannot_pay(name: str, c: float | None, k: int, ratio: dict[int, float] | None) -> str:
    """The warning for a drafter whose K drafted tokens cost more than the K + 1 a full acceptance yields.

    `ratio` is T(n)/T(1) (a cached calibration); without one, a verify is priced as one plain step, the
    cheapest it can be, so the warning is never a false alarm."""
    if c is None or c <= 0 or k <= 0:
        return ""
    verify = ratio[min(k + 1, max(ratio))] if ratio else 1.0
    cost = k * c + verify
    if cost < k + 1:
        return ""
    return (
        f"draft={name} costs {c:.2f} of a plain step per drafted token: K={k} costs {cost:.1f} plain steps for at "
        f"most {k + 1} tokens, slower than plain even if every draft is accepted; use a shallower draft or budget=auto"
    )


def warnings(target, drafter, budget, mlx_device: str) -> list[str]:
    """Every warning that applies to this session (each one line, without the `specpipe: warning: ` prefix)."""
    from specpipe.costmodel.worth import cached_ratio

    out = [slow_on_cpu(mlx_device, target.info.precision)]
    if not out[0] and getattr(budget, "name", "") == "fixed":  # budget=auto falls back to plain by itself
        hint = getattr(drafter, "cost_per_token", None)
        out.append(draft_cannot_pay(drafter.name, hint, int(getattr(budget, "k", 0)), cached_ratio(target)))
    return [w for w in out if w]
