"""One step for a list of rows: plan -> propose -> one target forward -> compare -> commit -> bonus -> emit.

Contract: `step(target, rows, clock)` advances every row by one step and yields `(row, event)` pairs: each
row's Drafted (after a deferred drafter's DraftPrefilled), then, after the one forward, its Verified,
RolledBack and Emitted, the same events with the same fields as a chain or a tree step has always made.
A row is one request (`Row`): its context, target cache and plug-ins. A chain is a tree with one branch:
a row with tree parts drafts trees (trees/proposal.py), any other a chain (core/proposal.py); both feed
[last_id, *nodes] to `forward_rows`. Afterwards each row's target cache holds its context except the
newest token (`last_id`), which the next step feeds first; `row.finished` says "eos" when a stop id cut it.

The shape is vLLM v1's: a proposer per row, one forward over the rows' flattened tokens, a rejection
sampler (the comparator) per row. A row alone (`batch` None) is fed through its own cache, exactly the
chain / tree forward of one request. Rows of one batch (batch/cache.py RaggedBatch: `row.batch`, every row of
it in the step, in its order) share ONE `Engine.forward` over [B, N]: each row's [last_id, *fed] padded to
N, at its own positions under its own mask; after every row settled, the batch commits once what each row
kept (`commit(kept, N)`: a batched row's rollback is the mask, its rejected and padding columns holes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import mlx.core as mx
import numpy as np

from specpipe.core.plan import StepPlan
from specpipe.core.proposal import ChainProposal, propose_chain
from specpipe.core.protocols import Bonus, Budget, Comparator, Drafter, Rollback
from specpipe.core.stages.verify import verify
from specpipe.engine.engine import Capture, ForwardResult
from specpipe.events import DraftPrefilled, Emitted, Event

if TYPE_CHECKING:
    from specpipe.engine.engine import Capture, ForwardResult
    from specpipe.trees.proposal import TreeParts, TreeProposal

T = TypeVar("T")


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
    batch: the RaggedBatch whose row this is (its `cache` unused: the batch holds it), or None: a row alone.
    row_id: its id in `batch` (`RaggedBatch.add`), once it joined.
    clock: this row's own clock (a batched row's events count from its admission); None: the step's.
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
    batch: Any = None
    row_id: int | None = None
    clock: Callable[[], float] | None = None

    @property
    def last_id(self) -> int:
        return self.context[-1]

    @property
    def wants_hidden(self) -> bool:
        """The verify records something for the drafter (draft_capture)."""
        return self.draft_capture is not None


def step(target, rows: list[Row], clock: Callable[[], float]) -> Iterator[tuple[Row, Event]]:
    """Advance every row by one step.

    Args:
        target: the target Engine every row decodes with.
        rows: the running rows (unfinished, with room for a token).
        clock: seconds since the run started, for the events' `t`.
    """
    if not rows:
        return
    proposals: list[ChainProposal | TreeProposal] = []
    for row in rows:  # ---- plan + propose: each row's budget and drafter
        proposals.append((yield from _tagged(row, _propose(target, row, row.clock or clock))))
    results = forward_rows(target, rows, proposals)  # ---- verify: one target forward
    kept, trees = [], {}
    for b, (row, proposal, result) in enumerate(zip(rows, proposals, results)):  # ---- compare, commit, bonus, emit
        new_ids, n = yield from _tagged(row, proposal.settle(target, row, result, row.clock or clock))
        kept.append(len(new_ids))  # accepted drafts + the next token: the columns of its forward it keeps
        if proposal.tree is not None and row.batch is not None:
            trees[b] = proposal.kept_rows  # a tree row keeps its root and path, wherever they were fed
        yield from _tagged(row, _emit(row, new_ids, n, row.clock or clock))
    if rows[0].batch is not None:  # the batch's one commit: every row's unkept columns become holes
        batch = rows[0].batch
        n = 1 + max(len(p.fed_ids) for p in proposals)
        fed = _fed_positions(batch, proposals, n) if trees else None
        tree_columns = {b: (columns, fed[b]) for b, columns in trees.items()} if fed is not None else None
        batch.commit(kept, n, states=results[0].states, trees=tree_columns)  # recurrent: each its state at kept[b]


def forward_rows(target, rows: list[Row], proposals: list) -> list[ForwardResult]:
    """One target forward over every row's [last_id, *fed tokens]; a tree row's nodes each see their own path.

    Returns per row its ForwardResult ([n + 1, vocab] logits, root first; hidden states when captured).
    """
    if rows[0].batch is None:
        if len(rows) != 1:
            raise ValueError(f"forward_rows: {len(rows)} rows without a shared batch (RaggedBatch): one row alone")
        (row,), (proposal,) = rows, proposals
        if proposal.tree is None:
            return [verify(target, row.cache, row.last_id, proposal.fed_ids, proposal.capture)]
        from specpipe.trees.forward import tree_forward

        return [tree_forward(target, row.cache, row.last_id, proposal.tree, proposal.capture)]
    return _forward_batch(target, rows, proposals)


def _forward_batch(target, rows: list[Row], proposals: list) -> list[ForwardResult]:
    """The rows of one RaggedBatch in one forward over [B, N]: each row's [last_id, *fed] padded to N."""
    batch = rows[0].batch
    if batch.size != len(rows) or any(r.batch is not batch for r in rows):
        raise ValueError(f"forward_rows: {len(rows)} rows of a batch of {batch.size}: every row of it steps, in order")
    fed = [[row.last_id, *p.fed_ids] for row, p in zip(rows, proposals)]
    n = max(len(f) for f in fed)
    ids = np.zeros((len(rows), n), dtype=np.uint32)  # padding columns are never kept (the commit's holes)
    for b, f in enumerate(fed):
        ids[b, : len(f)] = f
    positions, mask = batch.positions(n), batch.mask(n)
    if any(p.tree is not None for p in proposals):  # tree rows: each node at offset + depth, seeing its ancestors
        positions = _fed_positions(batch, proposals, n)
        mask = mx.concatenate([mask[..., : mask.shape[-1] - n], _fed_mask(proposals, n)], axis=-1)
    capture = _joint_capture([p.capture for p in proposals], batch.state_capture())
    started = time.perf_counter()
    for p in proposals:
        p.started = started  # a row's verify seconds: the shared forward's, not the later rows' drafting too
    result = target.forward(ids, batch.layers, capture=capture, positions=positions, mask=mask)
    lazy = [result.logits, *(a for a in (result.hidden, result.layer_hidden) if a is not None)]
    mx.eval(lazy, [layer.state for layer in batch.layers])

    def part(a, b: int, m: int):
        return a[b, :m] if a is not None else None

    return [
        ForwardResult(
            logits=result.logits[b, : len(f)],
            hidden=part(result.hidden, b, len(f)),
            layer_hidden=part(result.layer_hidden, b, len(f)),
            states=result.states,  # the whole batch's: its commit picks each row's
        )
        for b, f in enumerate(fed)
    ]


def _fed_positions(batch, proposals: list, n: int) -> np.ndarray:
    """[B, n] each fed column's position: a chain row's offset + column, a tree row's node at offset + depth."""
    positions = batch.positions(n)
    for b, p in enumerate(proposals):
        if p.tree is not None:
            depths = [0, *p.tree.depths()]
            positions[b, : len(depths)] = batch.offsets[b] + np.asarray(depths, dtype=np.int32)
    return positions


def _fed_mask(proposals: list, n: int) -> mx.array:
    """[B, n, n] which fed columns each fed column sees: causal for a chain row, the ancestor mask for a tree's
    root and nodes (its padding columns see causally and are never kept)."""
    block = np.tril(np.ones((len(proposals), n, n), dtype=bool))
    for b, p in enumerate(proposals):
        if p.tree is not None:
            m = len(p.tree) + 1
            block[b, :m, :m] = np.asarray(p.tree.ancestor_mask(), dtype=bool)
    return mx.array(block)


def _joint_capture(captures: list, states) -> Capture | None:
    """One capture for the batch's forward: hidden states or layer taps when any row's drafter asks (all rows
    get them), and the batch's per-position recurrent states when it has recurrent layers (`states`). No K/V
    view: a drafter attending to the target's K/V reads its own row of the batch, lent as it joined."""
    asked = [c for c in captures if c is not None]
    if not asked and states is None:
        return None  # the plain forward: nothing recorded
    layers = {c.layers for c in asked if c.layers}
    if len(layers) > 1:
        raise ValueError(f"rows of one batch tap different layers: {sorted(layers)}")
    return Capture(hidden=any(c.hidden for c in asked), states=states, layers=layers.pop() if layers else ())


def _propose(target, row: Row, clock) -> Generator[Event, None, ChainProposal | TreeProposal]:
    """This step's plan and draft for one row."""
    row.step += 1
    # the first token as soon as plain decoding's: before a draft model's prefill, or where the budget asks
    # (auto: a first verify of K + 1 tokens made short prompts' TTFT 10-30% later than plain's)
    first_plain = row.step == 1 and (not row.draft_ready or (row.budget.first_token_plain and row.k_override is None))
    room = row.max_tokens - len(row.output) - 1  # never more than the tokens still wanted, minus the bonus
    if row.tree is not None and not first_plain:
        from specpipe.trees.proposal import propose_tree_row

        yield from _prefill_draft(row, clock)
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
        yield from _prefill_draft(row, clock)
    return (yield from propose_chain(row, plan, clock, first_plain))


def _prefill_draft(row: Row, clock) -> Generator[Event, None, None]:
    """The deferred draft prefill (a draft model's: `draft_ready` False until now), over the context so far."""
    if row.draft_ready:
        return
    s = time.perf_counter()
    row.drafter.prefill(row.context)
    row.draft_ready = True
    yield DraftPrefilled(t=clock(), tokens=len(row.context), seconds=time.perf_counter() - s)


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
