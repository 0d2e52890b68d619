"""`budget=confidence`: draft up to k tokens, but a model drafter stops as
soon as its top probability falls below `p_min` (llama.cpp's `p_min`):
unsure guesses cost a draft forward and are usually rejected.

The stop itself happens inside the drafter (it alone sees q); the session
passes `p_min` to the constructor of a drafter that declares it and refuses
the others (preflight: before anything loads).
"""

from __future__ import annotations

from specpipe.budgets.fixed import FixedBudget
from specpipe.errors import SpecpipeError


class ConfidenceBudget(FixedBudget):
    name = "confidence"
    label_params = ("k", "p_min")  # what a report needs to tell two runs apart

    def __init__(self, k: int = 16, p_min: float = 0.6):
        super().__init__(k=k)
        if not 0.0 < p_min < 1.0:
            raise SpecpipeError(f"budget.p_min={p_min} is out of range: use a probability in (0, 1)")
        self.p_min = p_min
