"""`budget=adaptive`: K follows recent acceptance.

Grow after a fully accepted draft (double, up to k_max); shrink after a
rejection to halfway between K and what was accepted + 1 (down to k_min).
Example (k=8): all 8 accepted -> 16; then 3 of 16 accepted -> (16 + 4) / 2 = 10.
Steps where the drafter proposed fewer than K (nothing to look up) leave K alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specpipe.budgets.fixed import K_MAX
from specpipe.core.protocols import BudgetBase
from specpipe.errors import SpecpipeError

if TYPE_CHECKING:
    from specpipe.core.stages.draft import Draft


class AdaptiveBudget(BudgetBase):
    name = "adaptive"
    label_params = ("k", "k_max")  # what a report needs to tell two runs apart

    def __init__(self, k: int = 4, k_min: int = 1, k_max: int = 16):
        if not 1 <= k_min <= k_max <= K_MAX:
            raise SpecpipeError(f"budget.k_min={k_min}, budget.k_max={k_max}: need 1 <= k_min <= k_max <= {K_MAX}")
        if not k_min <= k <= k_max:
            raise SpecpipeError(f"budget.k={k} is outside [budget.k_min={k_min}, budget.k_max={k_max}]")
        self.k, self.k_min, self.k_max = k, k_min, k_max

    def next_k(self) -> int:
        return self.k

    def observe(
        self,
        drafted: int,
        accepted: int,
        *,
        draft_s: float | None = None,
        verify_s: float | None = None,
        verified: int | None = None,
        draft: Draft | None = None,
    ) -> None:
        if drafted < self.k and accepted == drafted:
            return  # a short draft says nothing about how long drafts could be
        if accepted == drafted:
            self.k = min(self.k_max, 2 * self.k)
        else:
            self.k = max(self.k_min, (self.k + accepted + 2) // 2)
