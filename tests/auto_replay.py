"""Replays synthetic runs through budget=auto and records every plan it returns.

`replay(scenario)` drives an AutoBudget the way the step does (plan, the drafter's draft, `fit` by its
evidence, a look back on a plain step, `observe` with injected draft / verify seconds), over several
requests of one session and a second session of the same pair (carried rates), with no model and no clock:
the drafter's tokens, acceptance and timings come from a seeded generator. The returned list of plans is
what tests/test_auto_replay.py compares with the recording in tests/data/auto_plans.json, taken before
budget=auto was split into its rates, costs and policy: the split must plan exactly as the one class did.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import SimpleNamespace

import msgspec

from specpipe.batch.pricing import BEYOND
from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.policy import AutoPolicy
from specpipe.core.stages.draft import Draft
from specpipe.costmodel.calibration import interpolate

CURVE = interpolate({1: 1.0, 2: 1.16, 3: 1.13, 5: 1.35, 9: 1.31, 17: 1.67, 33: 2.51})
LONG = {1024: {"ratio": {n: r * 1.2 if n > 1 else 1.0 for n, r in CURVE.items()}}}


@dataclass
class Scenario:
    """One kind of drafter and what its drafts do.

    kind: "ngram" (free, classes its drafts, looks back), "model" (a cost per token, chain tops for the
        stop), "lookup" (a model with a free prompt lookup in front that classes its drafts and looks back),
        "mtp" (a head on the target: a cost per token, chain tops, looks back one head forward at a time).
    acceptance: chance that each drafted token holds, given the one before did.
    batched: every other step the row shares a batched forward priced by a synthetic curve.
    """

    name: str
    kind: str
    c: float
    acceptance: float
    seed: int
    requests: tuple[int, ...] = (40, 24, 9, 30)
    batched: bool = False


SCENARIOS = (
    Scenario("ngram-code", "ngram", 0.0, 0.8, 1),
    Scenario("ngram-prose", "ngram", 0.0, 0.25, 2),
    Scenario("model-pair", "model", 0.3, 0.75, 3),
    Scenario("model-weak", "model", 0.35, 0.2, 4),
    Scenario("lookup-chain", "lookup", 0.25, 0.6, 5),
    Scenario("ngram-batched", "ngram", 0.0, 0.7, 6, batched=True),
    Scenario("model-batched", "model", 0.3, 0.7, 7, batched=True),
    Scenario("mtp-head", "mtp", 0.15, 0.5, 8),
)


class FakeDrafter:
    def __init__(self, s: Scenario):
        self.name = f"fake-{s.kind}"
        self.engine = None if s.kind in ("ngram", "mtp") else SimpleNamespace(info=SimpleNamespace(name="draft-model"))
        self.head_rows = None
        self.supports_hindsight = s.kind in ("ngram", "lookup", "mtp")
        self.evidence_is_free = s.kind == "lookup"
        self.cost_per_token = s.c
        self.plans_prefill = False  # a replayed request prices no draft prefill (nothing prefills here)
        self.prefill_window = None


def _batch_price(rng: random.Random) -> dict[int, float]:
    width = rng.choice([0, 1, 2, 4])
    return {n: (1.0 + 0.1 * (n - 1) if n <= width + 1 else BEYOND) for n in range(1, 34)}


def _session(budget: AutoBudget, drafter: FakeDrafter, s: Scenario, rng: random.Random, out: list) -> None:
    for max_tokens in s.requests:
        budget.start_request()
        emitted, cache_len = 0, rng.choice([60, 1100])
        while emitted < max_tokens:
            room = max_tokens - emitted - 1
            price = _batch_price(rng) if s.batched and rng.random() < 0.5 else None
            plan = budget.plan(cache_len, room, price=price)
            out.append(_record("plan", plan))
            lookup_k = plan.lookup_k if drafter.evidence_is_free else 0
            want = max(plan.k, lookup_k)
            tokens = rng.randint(max(0, want - 2), want) if want else 0
            evidence = rng.choice([1, 2, 3, 4]) if tokens and s.kind in ("ngram", "lookup") else None
            from_lookup = evidence is not None
            tops = [] if from_lookup or plan.chain_stop is None else [rng.uniform(0.05, 1.0) for _ in range(tokens)]
            draft = Draft(token_ids=list(range(tokens)), evidence=evidence, tops=tops)
            if tokens and evidence is not None and plan.fit:
                plan = budget.fit(plan, evidence, min(want, tokens))
                out.append(_record("fit", plan))
            drafted = min(max(plan.k, 0), tokens)
            draft.token_ids = draft.token_ids[:drafted]
            if drafted == 0 and plan.hindsight_k and emitted and drafter.supports_hindsight:
                m = min(plan.hindsight_k, emitted)
                matched = sum(1 for _ in iter(lambda: rng.random() < s.acceptance, False))
                look = rng.choice([1, 2, 3]) if s.kind in ("ngram", "lookup") else None
                budget.observe_hindsight(m, min(m, matched), evidence=look)
            accepted = 0
            while accepted < drafted and rng.random() < s.acceptance:
                accepted += 1
            t1 = 0.05 * rng.uniform(0.9, 1.1) * (3.0 if rng.random() < 0.05 else 1.0)  # now and then descheduled
            verify_s = t1 * CURVE[min(drafted + 1, 33)]
            draft_s = s.c * t1 * max(drafted, len(tops)) * rng.uniform(0.8, 1.2) if drafted else 0.0
            shared = price is not None  # a batched row's verify seconds are the shared forward's: none of its own
            budget.observe(drafted, accepted, draft_s=draft_s, verify_s=None if shared else verify_s, draft=draft)
            step = min(accepted + 1, max_tokens - emitted)
            emitted += step
            cache_len += step


def _record(kind: str, plan) -> dict:
    stop = plan.chain_stop
    return {
        "at": kind,
        "k": plan.k,
        "lookup_k": plan.lookup_k,
        "hindsight_k": plan.hindsight_k,
        "probe": plan.probe,
        "fit": plan.fit,
        "stop": None if stop is None else [round(stop.floor, 9), round(stop.keep, 9), [round(h, 9) for h in stop.hold]],
        "decision": _decision(plan.decision),
    }


def _decision(decision) -> dict | None:
    """The decision as recorded; the draft-prefill label (issue 57, newer than the recording) only when set."""
    if decision is None:
        return None
    fields = msgspec.to_builtins(decision)
    if not fields.get("prefill"):
        fields.pop("prefill", None)
    return fields


def replay(s: Scenario, monkeypatch) -> list[dict]:
    """Two sessions of one (target, drafter) pair, each over `s.requests`: every plan and fit, in order."""
    import specpipe.costmodel.calibration as calibration
    import specpipe.costmodel.context_curve as context_curve

    monkeypatch.setattr(calibration, "verify_cost_curve", lambda target, quick=True: {"ratio": dict(CURVE)})
    monkeypatch.setattr(calibration, "draft_cost", lambda drafter, target, quick=True: float(drafter.cost_per_token))
    monkeypatch.setattr(context_curve, "cached_curves", lambda engine: LONG)
    # the recording predates the short-answer rule (a probe must be repayable within the answer's expected
    # remaining tokens, issue 57): every other decision must still be the one class's; that rule has its own
    # tests (tests/test_prefill_price.py)
    monkeypatch.setattr(AutoPolicy, "_repays", lambda self, k: True)
    target = SimpleNamespace(model=None, info=SimpleNamespace(name=f"target-{s.name}", precision="float32"))
    rng = random.Random(s.seed)
    out: list[dict] = []
    for _ in range(2):
        budget = AutoBudget(k_max=16)
        drafter = FakeDrafter(s)
        budget.prepare(target, drafter)
        _session(budget, drafter, s, rng, out)
    return out
