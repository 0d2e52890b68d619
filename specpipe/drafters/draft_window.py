"""`draft.context`: what of a long context a draft model reads (attention sinks + the last W tokens).

Contract: `DraftWindow(window, sinks)` says which context positions the draft's cache holds. `prefill_ids(ids)`
gives the tokens a prefill feeds for the context `ids` (all of them when they fit, else the first `sinks` and
the last `window`); `skipped` counts the positions left out between the two, so a drafter's `cached_len` keeps
counting the whole context and its rollback stays the same arithmetic. The draft model sees the kept tokens at
consecutive positions, as a fresh model prefilled on them would (StreamingLLM's sinks + recent window,
TriForce's draft cache). Never runs a model: the drafter feeds what this says.

Worked example (sinks 2, window 3): a context of 9 ids a b c d e f g h i, all but the newest prefilled:
`prefill_ids(a..h)` -> [a b f g h] (5 cache positions), `skipped` = 3 (c d e), the drafter's `cached_len` 8.
The next draft feeds i at cache position 5. Once drafting has grown the recent part to 2 x window (`due`),
the drafter prefills the sinks and the last `window` again (one short prefill): the cache stays within
sinks + 2 x window whatever the answer's length.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpipe.errors import SpecpipeError


@dataclass
class DraftWindow:
    """The draft cache's view of the context: the first `sinks` positions and the last `window` (grows to
    2 x window while drafting, then is cut back)."""

    window: int
    sinks: int = 4
    skipped: int = 0  # context positions between the sinks and the window, not in the draft's cache

    def __post_init__(self) -> None:
        if self.window < 1:
            raise SpecpipeError(
                f"draft.context={self.window} is out of range: the recent tokens the draft reads, at least 1 "
                "(e.g. draft.context=256), or null for the whole prompt"
            )
        if self.sinks < 0:
            raise SpecpipeError(f"draft.sinks={self.sinks} is out of range: 0 or more first tokens kept (e.g. 4)")

    def prefill_ids(self, ids: list[int]) -> list[int]:
        """What a prefill of the context `ids` feeds the draft's (fresh) cache; sets `skipped`.

        Example (sinks 2, window 3): ids a..h -> [a b f g h], skipped 3.
        """
        self.skipped = max(0, len(ids) - self.sinks - self.window)
        if not self.skipped:
            return list(ids)
        return list(ids[: self.sinks]) + list(ids[len(ids) - self.window :])

    def cache_len(self, cached_len: int) -> int:
        """Positions in the draft's cache for `cached_len` context positions it stands for."""
        return cached_len - self.skipped

    def due(self, cached_len: int) -> bool:
        """True when the recent part has grown to 2 x window: `prefill_ids` over the context cuts it back."""
        return self.cache_len(cached_len) - self.sinks >= 2 * self.window
