"""budget=auto in a batch drafts up to the width that gives the whole batch the most tokens per second
(batch/pricing.py over T(B, n) and the rows' own rates): on a table where extra positions are dear at B > 1
the batched rows decode plain (K = 0); on a flat table they draft; either way every greedy row emits exactly
draft=none's tokens alone (tiny random llama, n-gram, real forwards)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hydra import compose, initialize

import specpipe.config.schema  # noqa: F401  (registers the schemas)
from specpipe.batch.costs import CostTable
from specpipe.batch.decoder import BatchDecoder, session_plugins
from specpipe.batch.pricing import BatchPricing, RowRates
from specpipe.events import Drafted, RunFinished
from specpipe.run.session import Session

TEXTS = ["the cat sat on the mat, the cat sat on the mat, the cat sat on the", "ab ab ab ab ab ab ab ab ab"]
MAX_TOKENS = [40, 12]  # the second row leaves early: the first then steps alone, priced by its own curve


def _table(slope_at_2: float) -> CostTable:
    """T(B, n) in seconds: 1 ms per plain step; each extra position costs `slope_at_2` of a plain step at B >= 2
    (a compute-bound batch) and 1% alone."""
    positions = [1, 2, 4, 8, 17]
    per_row = lambda slope: [1e-3 * (1 + slope * (n - 1)) for n in positions]  # noqa: E731
    return CostTable([1, 2], positions, np.array([per_row(0.01), per_row(slope_at_2)]))


def _rows(b: int, alpha: float, rho: float = 1.0, c: float = 0.0) -> list[RowRates]:
    expected = lambda k: 1 + sum(alpha ** (i + 1) for i in range(k))  # noqa: E731  (geometric acceptance)
    return [RowRates(expected, c, rho)] * b


def test_the_width_is_the_batchs_best_rate():
    cheap, dear = BatchPricing(_table(0.01), k_max=16), BatchPricing(_table(2.0), k_max=16)
    assert cheap.best_k(_rows(2, 0.8), 2) > 4  # positions nearly free: draft long
    assert dear.best_k(_rows(2, 0.8), 2) == 0  # each position costs 2 plain steps: nothing pays
    assert cheap.best_k(_rows(2, 0.8, rho=0.0), 2) == 0  # drafters that never propose: plain
    assert cheap.best_k(_rows(2, 0.8, c=1.0), 2) == 0  # drafts that cost a target forward each
    assert cheap.curve(_rows(2, 0.8), 1) is None  # a batch of one prices as if alone
    curve = cheap.curve(_rows(2, 0.8), 2)
    assert curve is not None and curve[1 + cheap.width] == 1.0 and curve[2 + cheap.width] > 1e5


@pytest.fixture(scope="module")
def session():
    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="config", overrides=["model=tiny-random", "draft=ngram", "budget=auto"])
    return Session(cfg)


def _run(session, pricing):
    decoder = BatchDecoder(session.target, session_plugins(session), pricing=pricing)
    prompts = [session.target.encode_prompt(t, chat=False) for t in TEXTS]
    rows = [decoder.add(p, m) for p, m in zip(prompts, MAX_TOKENS)]
    drafted = {"batched": 0, "alone": 0}
    while decoder.rows:
        batched = len(decoder.rows) > 1
        report = decoder.step()
        for s in report.rows:
            for e in s.events:
                if isinstance(e, Drafted):
                    drafted["batched" if batched else "alone"] += len(e.draft_ids)
    return [row.output for row in rows], drafted


def _alone(session, text: str, max_tokens: int) -> list[int]:
    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="config", overrides=["model=tiny-random", "draft=none"])
    final = list(Session(cfg).generate(session.target.encode_prompt(text, chat=False), max_tokens))[-1]
    assert isinstance(final, RunFinished)
    return list(final.token_ids)


def test_a_dear_batch_decodes_plain_and_a_cheap_one_drafts(session):
    plain = [_alone(session, t, m) for t, m in zip(TEXTS, MAX_TOKENS)]
    dear_out, dear = _run(session, BatchPricing(_table(2.0)))
    cheap_out, cheap = _run(session, BatchPricing(_table(0.01)))
    assert dear_out == plain and cheap_out == plain
    assert dear["batched"] == 0, dear  # no draft pays for what two rows wait at 3 plain steps per position
    assert cheap["batched"] > 0, cheap


def test_a_batched_rows_draft_cost_is_not_learned_from_the_shared_forward(session):
    """A batched row's verify seconds are the shared forward's: they imply no T(1) of the row, so the step hands
    its budget none, and its draft cost c stays what it learned alone. (A probe past the batch's width, priced
    BEYOND there, once implied a T(1) of microseconds: c grew 0.27 -> 2e5 over a served sitting.)"""
    from specpipe.budgets.auto import AutoBudget

    seen: dict[str, list] = {"batched": [], "alone": []}

    class Watched(AutoBudget):  # the real budget, recording what the step reports to it
        def observe(self, drafted, accepted, **kw):
            if drafted:
                seen["batched" if self.costs.batch_width is not None else "alone"].append(kw["verify_s"])
            super().observe(drafted, accepted, **kw)

    plugins = session_plugins(session)

    def watched(*args, **kw):
        p = plugins(*args, **kw)
        budget = Watched(k_max=4)
        budget.prepare(session.target, p.drafter)
        return replace(p, budget=budget)

    decoder = BatchDecoder(session.target, watched, pricing=BatchPricing(_table(0.01)))
    for text, m in zip(TEXTS, MAX_TOKENS):
        decoder.add(session.target.encode_prompt(text, chat=False), m)
    while decoder.rows:
        decoder.step()
    assert seen["batched"] and all(s is None for s in seen["batched"]), seen
    assert all(s is not None for s in seen["alone"]), seen


def test_a_batched_row_never_drafts_past_the_batchs_width_not_even_a_probe():
    """The batch prices its width from every row's rates; a row probing past it widens every row's forward.
    (The Qwen pair at 8 clients: probes that held re-probed every step, 2 tokens a step where the batch priced
    plain, and the server ran at 0.63x of plain decoding's throughput.)"""
    from specpipe.batch.pricing import BEYOND
    from specpipe.budgets.auto import AutoBudget

    def budget_after_a_held_probe() -> AutoBudget:
        budget = AutoBudget(probe_every=1)
        budget.ratio = {n: 1.0 + 0.1 * (n - 1) for n in range(1, 34)}
        budget.c = 0.27
        k = budget.plan(10, 100).k
        budget.observe(k, k, draft_s=0.05, verify_s=0.5)  # the draft held entirely: "probe again next step"
        return budget

    alone = budget_after_a_held_probe()
    assert alone.plan(12, 100).k > 0, "alone, the row drafts (or probes) on"
    batched = budget_after_a_held_probe()
    plain = {n: 1.0 if n <= 1 else BEYOND for n in range(1, 34)}  # the batch decodes plain
    for _ in range(4):
        plan = batched.plan(12, 100, price=plain)
        assert plan.k == 0 and not plan.probe and plan.decision.reason in ("plain", "batch width"), plan
    two = {n: 1.0 if n <= 3 else BEYOND for n in range(1, 34)}  # the batch drafts 2
    assert 0 < batched.plan(12, 100, price=two).k <= 2
