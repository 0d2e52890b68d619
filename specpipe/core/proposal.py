"""The chain half of the one step (core/step.py): a row whose drafts are token chains.

Contract: `propose_chain(row, plan, clock)` asks the row's drafter for up to `plan.k` tokens (a free lookup
up to `plan.lookup_k`), lets the budget resize the draft by the drafter's evidence (`Budget.fit`), looks
back on a plain step (`plan.hindsight_k`) and yields the Drafted event; the one forward scores
[last_id, *draft] (stages/verify.py); `ChainProposal.settle` runs the row's comparator and bonus, then
its rollback strategy on the target cache and the drafter's rollback, yielding Verified and RolledBack.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specpipe.core.plan import StepPlan
from specpipe.core.stages.compare import first_false
from specpipe.core.stages.draft import Draft
from specpipe.engine.engine import Capture
from specpipe.events import Drafted, Event, RolledBack, Verified

if TYPE_CHECKING:
    from specpipe.core.row import Row
    from specpipe.engine.engine import ForwardResult


@dataclass
class ChainProposal:
    """One row's draft on its way to the forward, and what settling it needs."""

    plan: StepPlan
    draft: Draft
    draft_s: float
    first_plain: bool  # a plain first step: a deferred drafter has seen nothing, so it is not rolled back
    capture: Any = None  # what the rollback strategy and the drafter asked the forward to record
    started: float = 0.0  # perf_counter when the verify began (its seconds)
    tree: None = None  # a chain: the forward's plain causal attention

    @property
    def fed_ids(self) -> list[int]:
        return self.draft.token_ids

    def settle(self, target, row: Row, result: ForwardResult, clock) -> Generator[Event, None, tuple[list[int], int]]:
        """Compare, pick the bonus, roll both caches back; returns (accepted + next token, accepted count)."""
        draft, drafter = self.draft, row.drafter
        k_eff = len(draft.token_ids)
        logits = result.logits  # [k_eff + 1, vocab]
        if row.draft_capture is not None:
            fed = [row.last_id, *draft.token_ids]
            drafter.observe_hidden(len(row.context) - 1, fed, result.hidden, result.layer_hidden)
        verdict = row.comparator.compare(draft, logits)
        n = verdict.accepted
        bonus_id = row.bonus.pick(logits[k_eff]) if n == k_eff else None
        verify_s = time.perf_counter() - self.started
        next_id = verdict.recovered_id if bonus_id is None else bonus_id
        assert next_id is not None, "a comparator that rejects must recover a token"
        yield Verified(
            t=clock(),
            step=row.step,
            accepted_ids=draft.token_ids[:n],
            rejected_ids=draft.token_ids[n:],
            recovered_id=verdict.recovered_id if bonus_id is None else None,
            bonus_id=bonus_id,
            seconds=verify_s,
            rejected_text=target.decode(draft.token_ids[n:]) if n < k_eff else "",
            overlap=verdict.overlap,
        )

        # ---- rollback: keep context + accepted drafts in both caches
        s = time.perf_counter()
        target_drop = k_eff - n
        row.rollback.rollback(row.cache, target_drop, engine=target, fed_ids=[row.last_id, *draft.token_ids])
        draft_drop = 0 if self.first_plain else drafter.rollback(len(row.context) + n)
        # a batched row's (priced) verify seconds are the shared forward's: no timing of this row's T(n)
        own_s = verify_s if row.price is None else None
        row.budget.observe(k_eff, n, draft_s=self.draft_s, verify_s=own_s, draft=draft)
        yield RolledBack(
            t=clock(),
            step=row.step,
            strategy=row.rollback.last_choice or row.rollback.name,
            target_dropped=target_drop,
            draft_dropped=draft_drop,
            seconds=time.perf_counter() - s,
        )
        return draft.token_ids[:n] + [next_id], n


def propose_chain(row: Row, plan: StepPlan, clock, first_plain: bool) -> Generator[Event, None, ChainProposal]:
    """Draft by `plan` (already cut to the tokens still wanted minus the bonus) and yield the Drafted event."""
    drafter, budget = row.drafter, row.budget
    s = time.perf_counter()
    f0 = drafter.forwards
    # a free lookup beside a model (evidence_is_free) may draft past the model's K, even at K = 0
    lookup_k = plan.lookup_k if drafter.evidence_is_free else 0
    draft = drafter.propose(row.context, plan) if max(plan.k, lookup_k) > 0 else Draft(token_ids=[])
    f1 = drafter.forwards
    if draft.token_ids:  # what the budget learns from travels with the draft, not through the drafter
        draft.evidence, draft.tops = drafter.last_evidence, list(drafter.last_tops)
    if draft.token_ids and draft.evidence is not None and plan.fit:
        # the drafter said how sure this draft is (n-gram: the match length): the budget keeps as much of
        # it as that class's acceptance pays for, maybe none (a plain step)
        plan = budget.fit(plan, draft.evidence, min(max(plan.k, lookup_k), len(draft.token_ids)))
    k = plan.k
    draft.token_ids = draft.token_ids[: max(k, 0)]
    k_eff = len(draft.token_ids)
    looked_back, matched = _hindsight(row, plan)
    draft_s = time.perf_counter() - s
    # every draft forward of this step, by purpose: what proposed a verified token, what did not
    drafting = min(f1 - f0 - draft.catchup_forwards, k_eff)
    yield Drafted(
        t=clock(),
        step=row.step,
        k=max(k, 0),
        draft_ids=draft.token_ids,
        seconds=draft_s,
        hindsight_ids=looked_back,
        hindsight_matched=matched,
        forwards=drafter.forwards - f0,
        draft_forwards=drafting,
        catchup_forwards=draft.catchup_forwards,
        catchup_tokens=draft.catchup_tokens,
        hindsight_forwards=drafter.forwards - f1,
        wasted_forwards=f1 - f0 - draft.catchup_forwards - drafting,
        probe=plan.probe and k_eff > 0,
        decision=plan.decision,
        source=draft.source,  # draft=chain: which source drafted it
    )
    started = time.perf_counter()
    states = row.rollback.before_forward(row.cache)
    # nothing asked for, no capture: the plain forward (draft=none, trim)
    want = row.draft_capture
    capture = (
        Capture(
            hidden=want.hidden if want else False,
            states=states,
            layers=want.layers if want else (),
            kv=want.kv if want else None,
        )
        if states is not None or want is not None
        else None
    )
    return ChainProposal(plan, draft, draft_s, first_plain, capture, started)


def _hindsight(row: Row, plan: StepPlan) -> tuple[list[int], int]:
    """On a K = 0 step the plan may ask what the drafter would have said for the last tokens the target
    emitted (never the prompt's): evidence without a verify forward."""
    m = min(plan.hindsight_k, len(row.output)) if plan.k <= 0 else 0
    if m <= 0 or not row.drafter.supports_hindsight:
        return [], 0
    guess = row.drafter.hindsight(row.context, m)[:m]
    matched = first_false([g == t for g, t in zip(guess, row.context[-m:])])  # the greedy comparator's rule
    row.budget.observe_hindsight(len(guess), matched, evidence=row.drafter.last_evidence)
    return guess, matched
