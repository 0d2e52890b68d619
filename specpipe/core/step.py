"""One step for a list of rows: plan -> propose -> one target forward -> compare -> commit -> bonus -> emit.

Contract: `step(target, rows, clock)` advances every row by one step and yields `(row, event)` pairs: each
row's Drafted (after a deferred drafter's DraftPrefilled, or a chunked one's next chunk), then, after the one
forward, its Verified, RolledBack and Emitted, the same events with the same fields as a chain or a tree step
has always made. A row is one request (core/row.py `Row`): its context, target cache and plug-ins; what it proposes is a
`Proposal` (core/row.py). A chain is a tree with one branch:
a row with tree parts drafts trees (trees/proposal.py), any other a chain (core/proposal.py); both feed
[last_id, *nodes] to `forward_rows`. Afterwards each row's target cache holds its context except the
newest token (`last_id`), which the next step feeds first; `row.finished` says "eos" when a stop id cut it.

The shape is vLLM v1's: a proposer per row, one forward over the rows' flattened tokens, a rejection
sampler (the comparator) per row. Where the rows' K/V lives is their storage's business (core/storage.py,
`row.storage`), not the step's: a row alone (`LoneCache`) is fed through its own cache, exactly the chain /
tree forward of one request; the rows of one batch (batch/storage.py `BatchStorage`, every row of it in the
step, in its order) share ONE `Engine.forward` over [B, N]. After every row settled, the storage commits once
what each row kept (a batch: its rejected and padding columns become holes; alone: its rollback already did).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, TypeVar

from specpipe.core.plan import DraftPrefill, StepPlan
from specpipe.core.proposal import propose_chain
from specpipe.core.row import Proposal, Row
from specpipe.events import DraftPrefilled, Emitted, Event

if TYPE_CHECKING:
    from specpipe.engine.engine import ForwardResult

T = TypeVar("T")


def step(target, rows: list[Row], clock: Callable[[], float]) -> Iterator[tuple[Row, Event]]:
    """Advance every row by one step.

    Args:
        target: the target Engine every row decodes with.
        rows: the running rows (unfinished, with room for a token).
        clock: seconds since the run started, for the events' `t`.
    """
    if not rows:
        return
    proposals: list[Proposal] = []
    for row in rows:  # ---- plan + propose: each row's budget and drafter
        proposals.append((yield from _tagged(row, _propose(target, row, row.clock or clock))))
    results = forward_rows(target, rows, proposals)  # ---- verify: one target forward
    kept = []
    for row, proposal, result in zip(rows, proposals, results):  # ---- compare, rollback, bonus, emit
        new_ids, n = yield from _tagged(row, proposal.settle(target, row, result, row.clock or clock))
        kept.append(len(new_ids))  # accepted drafts + the next token: the columns of its forward it keeps
        yield from _tagged(row, _emit(row, new_ids, n, row.clock or clock))
    rows[0].storage.commit(rows, proposals, results, kept)  # a batch's one commit (its holes); alone, nothing left


def forward_rows(target, rows: list[Row], proposals: list) -> list[ForwardResult]:
    """One target forward over every row's [last_id, *fed tokens]; a tree row's nodes each see their own path.
    The rows' storage runs it (core/storage.py: a row alone its own cache, the rows of a batch their RaggedBatch).

    Returns per row its ForwardResult ([n + 1, vocab] logits, root first; hidden states when captured).
    """
    return rows[0].storage.forward(target, rows, proposals)


def _propose(target, row: Row, clock) -> Generator[Event, None, Proposal]:
    """This step's plan and draft for one row."""
    row.step += 1
    # the first token as soon as plain decoding's: before a draft model's prefill, or where the budget asks
    # (auto: a first verify of K + 1 tokens made short prompts' TTFT 10-30% later than plain's)
    first_plain = row.step == 1 and (not row.draft_ready or (row.budget.first_token_plain and row.k_override is None))
    room = row.max_tokens - len(row.output) - 1  # never more than the tokens still wanted, minus the bonus
    if row.tree is not None and not first_plain:
        from specpipe.trees.proposal import propose_tree_row

        yield from _prefill_draft(row, clock, None)
        return (yield from propose_tree_row(row, room, clock))
    if first_plain:
        plan = StepPlan.first_token()
    elif row.k_override is not None:
        plan = StepPlan.override(row.k_override, room)
    else:
        plan = row.budget.plan(len(row.context) - 1, room, price=row.price)  # the cache holds all but the newest
    if not first_plain and max(plan.k, plan.lookup_k, plan.hindsight_k) > 0:
        # a draft model prefills when its row first drafts: a step the budget makes plain needs no draft, and
        # in a batch that decodes plain (8 rows on a CPU) every joining row's prefill stalled every row
        yield from _prefill_draft(row, clock, plan.prefill)
    if row.drafter.catching_up and not first_plain:  # once started, a chunk every step, plain ones too
        yield from _catch_up(row, clock)
        if row.drafter.catching_up:  # still behind: the model drafts nothing yet, a free lookup may
            plan = plan.free_only()
    return (yield from propose_chain(row, plan, clock, first_plain))


def _prefill_draft(row: Row, clock, prefill: DraftPrefill | None) -> Generator[Event, None, None]:
    """The deferred draft prefill (a draft model's: `draft_ready` False until now), over the context so far, as
    the budget chose (`prefill`: whole, a window, none; None: as configured)."""
    if row.draft_ready:
        return
    s = time.perf_counter()
    row.prefill_drafter(row.context, prefill)
    row.draft_ready = True
    fed = row.drafter.prefill_tokens
    yield DraftPrefilled(
        t=clock(), tokens=len(row.context) - 1 if fed is None else fed, seconds=time.perf_counter() - s
    )


def _catch_up(row: Row, clock) -> Generator[Event, None, None]:
    """One chunk of a chunked draft prefill, between this row's target steps (MLX on a CPU has no second
    device to overlap it with: it runs here, in turn); nothing once the rest is left to the next model draft."""
    s = time.perf_counter()
    fed = row.drafter.catch_up(row.context)
    if fed:
        yield DraftPrefilled(t=clock(), tokens=fed, seconds=time.perf_counter() - s)


def _emit(row: Row, new_ids: list[int], n: int, clock) -> Generator[Event, None, None]:
    """The step's tokens reach the output, cut at a stop token or at max_tokens; the context takes them all."""
    kept, from_draft = cut(new_ids, n, row.stop_ids, row.max_tokens - len(row.output))
    pieces = []
    for tid in kept:
        row.detok.add_token(tid)
        pieces.append(row.detok.last_segment)
    yield Emitted(
        t=clock(), step=row.step, token_ids=kept, text="".join(pieces), from_draft=from_draft, token_texts=pieces
    )
    row.output.extend(kept)
    row.context.extend(new_ids)
    if len(kept) < len(new_ids) and len(row.output) < row.max_tokens:
        row.finished = "eos"


def _tagged(row: Row, events: Generator[Event, None, T]) -> Generator[tuple[Row, Event], None, T]:
    """`events` as (row, event) pairs; returns what the generator returned."""
    while True:
        try:
            event = next(events)
        except StopIteration as done:
            return done.value
        yield row, event


def cut(new_ids: list[int], n_from_draft: int, stop_ids: set[int], room: int) -> tuple[list[int], int]:
    """Tokens of this step that reach the output.

    Example: new_ids [4, 9, 2, 7] (3 from the draft), stop {2}, room 10
    -> ([4, 9], 2): the stop token and everything after it are dropped.
    """
    kept = []
    for tid in new_ids[:room]:
        if tid in stop_ids:
            break
        kept.append(tid)
    return kept, min(len(kept), n_from_draft)
