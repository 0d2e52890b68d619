"""`draft=none`: propose nothing, so every step is one plain decoding step
through the same engine: the baseline of every comparison."""

from __future__ import annotations

from specpipe.stages.draft import Draft


class NoneDrafter:
    name = "none"
    engine = None
    cache = None
    cached_len = 0
    forwards = 0
    needs_hidden = False

    def use_rollback(self, strategy) -> None:
        pass  # no cache to roll back

    def rollback(self, kept_len: int) -> int:
        return 0

    def __init__(self, **_runtime):
        pass

    def prefill(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, context_ids: list[int], k: int) -> Draft:
        return Draft(token_ids=[])
