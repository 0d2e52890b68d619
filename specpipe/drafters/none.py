"""`draft=none`: propose nothing, so every step is one plain decoding step
through the same engine: the baseline of every comparison."""

from __future__ import annotations

from specpipe.core.plan import StepPlan
from specpipe.core.protocols import DrafterBase
from specpipe.core.stages.draft import Draft


class NoneDrafter(DrafterBase):
    name = "none"

    def prefill(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, context_ids: list[int], plan: StepPlan) -> Draft:
        return Draft(token_ids=[])
