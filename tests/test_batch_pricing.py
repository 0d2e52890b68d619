"""budget=auto in a batch prices each row's draft by what the batch's wider forward costs every row
(batch/pricing.py over T(B, n)): on a table where extra positions are dear at B > 1 the batched rows decode
plain (K = 0); on a flat table they draft; either way every greedy row emits
exactly draft=none's tokens alone (tiny random llama, n-gram, real forwards)."""

from __future__ import annotations

import numpy as np
import pytest
from hydra import compose, initialize

import specpipe.config  # noqa: F401  (registers the schemas)
from specpipe.batch.costs import CostTable
from specpipe.batch.decoder import BatchDecoder, session_plugins
from specpipe.batch.pricing import BatchPricing
from specpipe.events import Drafted, RunFinished
from specpipe.session import Session

TEXTS = ["the cat sat on the mat, the cat sat on the mat, the cat sat on the", "ab ab ab ab ab ab ab ab ab"]
MAX_TOKENS = [40, 12]  # the second row leaves early: the first then steps alone, priced by its own curve


def _table(slope_at_2: float) -> CostTable:
    """T(B, n) in seconds: 1 ms per plain step; each extra position costs `slope_at_2` of a plain step at B >= 2
    (a compute-bound batch) and 1% alone."""
    positions = [1, 2, 4, 8, 17]
    per_row = lambda slope: [1e-3 * (1 + slope * (n - 1)) for n in positions]  # noqa: E731
    return CostTable([1, 2], positions, np.array([per_row(0.01), per_row(slope_at_2)]))


def test_the_curve_is_the_rows_share_of_the_batchs_loss():
    pricing = BatchPricing(_table(0.5))
    alone, one_of_two, both = pricing.curve(1, 1), pricing.curve(2, 1), pricing.curve(2, 2)
    assert alone[1] == one_of_two[1] == both[1] == 1.0
    assert alone[5] == pytest.approx(1.04)  # the row's own T(1, 5) / T(1, 1)
    assert both[5] == pytest.approx(3.0)  # every row drafts: each pays its own T(2, 5) / T(2, 1)
    assert one_of_two[5] == pytest.approx(1 + 2 * 2.0)  # the one drafting row pays for both rows' wait
    assert all(one_of_two[n] <= one_of_two[n + 1] for n in range(1, 33))


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
