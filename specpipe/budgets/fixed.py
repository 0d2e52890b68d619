"""`budget=fixed`: draft the same k every step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specpipe.core.plan import K_MAX
from specpipe.core.protocols import BudgetBase
from specpipe.errors import SpecpipeError

__all__ = ["K_MAX", "FixedBudget"]  # K_MAX: budgets and the batch import it from here

if TYPE_CHECKING:
    from specpipe.core.stages.draft import Draft


class FixedBudget(BudgetBase):
    name = "fixed"
    label_params: tuple[str, ...] = ("k",)  # what a report needs to tell two runs apart

    def __init__(self, k: int = 8):
        if not 1 <= k <= K_MAX:
            raise SpecpipeError(f"budget.k={k} is out of range: choose 1..{K_MAX} (or draft=none for plain decoding)")
        self.k = k

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
        """Fixed budgets ignore outcomes; adaptive ones learn from them."""
