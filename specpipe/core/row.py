"""A request between steps (`Row`) and the protocol of what it proposes each step (`Proposal`).

Contract: a `Row` holds what the one step (core/step.py) reads and advances for one request: its context,
its plug-ins, its output so far and where its target K/V lives (`storage`, core/storage.py). A `Proposal`
is one row's draft on its way to the step's one target forward: `fed_ids` (what follows the row's last_id in
the forward), `capture` (what the forward records for its drafter and rollback), `tree` (None for a chain:
causal attention; a tree's nodes at offset + depth under its ancestor mask) and `settle`, which compares,
rolls back and yields the row's Verified and RolledBack. Chains (core/proposal.py `ChainProposal`) and trees
(trees/proposal.py `TreeProposal`) are its two kinds. Nothing here runs a forward.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from specpipe.core.protocols import Bonus, Budget, Comparator, Drafter, Rollback
from specpipe.core.storage import LoneCache
from specpipe.events import Event

if TYPE_CHECKING:
    from specpipe.core.plan import DraftPrefill
    from specpipe.engine.engine import Capture, ForwardResult
    from specpipe.trees.proposal import TreeParts


class Proposal(Protocol):
    """One row's draft between its proposing and its settling (see the module docstring)."""

    tree: Any  # trees/tree.py TokenTree of the fed nodes, or None: a chain
    capture: Any  # engine Capture for the forward, or None
    started: float  # perf_counter when the forward began: the verify's seconds run from here

    @property
    def fed_ids(self) -> list[int]: ...

    def settle(self, target, row: Row, result: ForwardResult, clock) -> Generator[Event, None, tuple[list[int], int]]:
        """Compare, pick the next token, roll back; returns (the step's new ids, how many were accepted drafts)."""
        ...


@dataclass
class Row:
    """One request between steps: what the step reads and advances.

    context: prompt + emitted tokens (and any token a stop id cut: the caches hold it); the target cache
        holds all but the newest, `last_id`.
    tree: tree parts (tree != chain), or None: chains.
    draft_ready: False while the drafter's prefill waits (a draft model): the first step is plain, and the first
        later step that drafts prefills it (DraftPrefilled); steps the budget makes plain never wait for it.
    draft_capture: what the drafter reads of the target's forwards (`Drafter.capture`: draft=mtp's final hidden
        state, draft=eagle3's layer taps); every verify records it and hands it to `observe_hidden`. None: nothing.
    k_override: RunControl's K for this step (None: the budget plans).
    price: the batch's price of this row's draft (batch/pricing.py; `Budget.plan(price=)`), set while the row
        shares a batched forward; None: it decodes alone.
    detok: the target tokenizer's streaming detokenizer, for the Emitted text.
    storage: where its target K/V lives (core/storage.py RowStorage): None makes it `LoneCache(cache)`, a row
        alone; the rows of a batch share a batch/storage.py BatchStorage (their `cache` unused).
    row_id: its id in a batch's storage (`RaggedBatch.add`), once it joined; None alone.
    clock: this row's own clock (a batched row's events count from its admission); None: the step's.
    draft_resume: what the drafter kept with the prefix store's snapshot this request started from (its
        `resume` takes it in place of `prefill`); None: it prefills from the prompt.
    """

    context: list[int]
    cache: list
    drafter: Drafter
    budget: Budget
    comparator: Comparator
    rollback: Rollback
    bonus: Bonus
    detok: Any
    max_tokens: int
    stop_ids: set[int]
    tree: TreeParts | None = None
    draft_ready: bool = True
    draft_capture: Capture | None = None
    k_override: int | None = None
    price: dict[int, float] | None = None
    output: list[int] = field(default_factory=list)
    step: int = 0
    finished: str = ""  # "eos" once a stop id ended the row; "" while it runs
    storage: Any = None
    row_id: int | None = None
    clock: Callable[[], float] | None = None
    draft_resume: Any = None

    def __post_init__(self) -> None:
        if self.storage is None:
            self.storage = LoneCache(self.cache)

    def prefill_drafter(self, prompt_ids: list[int], planned: DraftPrefill | None = None) -> None:
        """The drafter reads the prompt: resuming from the prefix store's state when this request has one and
        its budget chose the whole prompt (`planned`, a deferred prefill's: at once or in chunks, which the stored
        state makes unneeded), else as planned (a window, no draft prefill)."""
        state, self.draft_resume = self.draft_resume, None
        if state is not None and (planned is None or planned.kind in ("full", "chunked")):
            self.drafter.resume(prompt_ids, state)
        else:
            self.drafter.prefill_planned(prompt_ids, planned)

    @property
    def last_id(self) -> int:
        return self.context[-1]

    @property
    def wants_hidden(self) -> bool:
        """The verify records something for the drafter (draft_capture)."""
        return self.draft_capture is not None
