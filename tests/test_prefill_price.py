"""budget=auto prices a draft model's prefill (budgets/prefill_price.py) and short answers
(budgets/probe_rules.py `repays`, through policy `_repays`).

Unit: for a given price table the choice is full, window or none. Short answers: a probe the expected
remaining tokens cannot repay is not bought; a long answer still probes. End to end on a tiny pair: the
choice is made on the request's first plan, logged on its decision and in the run's stats, carried to the
draft's prefill, and the output stays the target's own. The summary's end-to-end estimate prices the
prefill a decode estimate leaves out.
"""

from __future__ import annotations

import pytest
from conftest import first_difference, noisy_copy, prepared, tiny

from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.fixed import FixedBudget
from specpipe.budgets.prefill_price import PrefillPrices, choose_prefill
from specpipe.cli.generate import summary_line
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import DraftPrefill
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.costmodel.worth import Estimate, end_to_end
from specpipe.drafters.model import ModelDrafter
from specpipe.drafters.none import NoneDrafter
from specpipe.events import Drafted, RunFinished
from specpipe.rollbacks.trim import TrimRollback

FLAT = {n: 1.0 + 0.02 * n for n in range(1, 34)}


def prices(prompt_len: int, tokens: float, **kw) -> PrefillPrices:
    table = {"prefill": 0.1, "saving": 0.3, "window": 256, "sinks": 4, "window_keeps": 0.9} | kw
    return PrefillPrices(prompt_len=prompt_len, tokens=tokens, **table)


@pytest.mark.parametrize(
    "table, kind",
    [
        (prices(800, 32), "none"),  # a short answer repays no prefill: 9.6 saved against 26 or 80 spent
        (prices(800, 1000), "window"),  # 270 - 26 beats 300 - 80
        (prices(800, 1000, window_keeps=0.5), "full"),  # a window that loses half the saving: 300 - 80 wins
        (prices(200, 100), "full"),  # the prompt fits the window (no window option): 30 - 20
        (prices(200, 64), "none"),  # ... but 64 answer tokens save 19.2 of the 20 it costs
        (prices(800, 32, free_saving=0.1), "none"),  # a free lookup alone: 3.2 for nothing spent
        (prices(800, 1000, full=False), "window"),  # the user capped the draft at draft.context
    ],
)
def test_the_choice_for_a_price_table(table, kind):
    choice = choose_prefill(table)
    assert choice.kind == kind, choice
    assert choice.net is not None and choice.net[kind] == max(choice.net.values())
    assert (choice.window == table.window) == (kind == "window")


def test_the_logged_label_names_the_choice_and_every_option():
    label = choose_prefill(prices(800, 1000)).label()
    assert label.startswith("draft prefill window 256 (net +244.0 steps; ") and "full +220.0" in label
    assert "none +0.0" in label and "over ~1000 tokens" in label


def auto_with(c: float, alpha: float) -> AutoBudget:
    b = AutoBudget(k_max=32, prior_alpha=alpha)
    b.ratio, b.c = FLAT, c
    return b


def test_a_short_answer_buys_no_probe_it_cannot_repay():
    # drafting costs a full step per token: plain wins even on optimistic rates, yet the first step probes to
    # learn alpha on a long answer; with 3 tokens left that probe could never be repaid
    long, short = auto_with(1.0, 0.3), auto_with(1.0, 0.3)
    assert long.plan(100, room=500).k == long.probe_k and long.decision.reason == "probe"
    plan = short.plan(100, room=2)
    assert plan.k == 0 and short.decision.reason == "short answer"


def test_earlier_answers_length_prices_the_next_request():
    b = auto_with(1.0, 0.3)
    b.start_request()
    for _ in range(3):  # a 3-token answer (plain steps)
        b.observe(0, 0)
    b.start_request()
    assert b.answer_len == 3
    assert b.plan(100, room=500).k == 0 and b.decision.reason == "short answer"  # max_tokens alone said 501


def test_the_draft_reads_what_the_plan_says():
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.3)
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the hat; the dog", chat=False)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other")
    drafter.prefill_planned(prompt, DraftPrefill(kind="window", window=8, sinks=2))
    assert drafter.window is not None and drafter.window.cache_len(drafter.cached_len) == 10
    drafter.prefill_planned(prompt, DraftPrefill(kind="none"))
    assert drafter.cache[0].offset == 0 and drafter.cached_len == 0
    drafter.prefill_planned(prompt, None)  # as configured: the whole prompt but the newest token
    assert drafter.window is None and drafter.cache[0].offset == len(prompt) - 1


def test_auto_chooses_logs_and_stays_lossless_on_a_long_prompt_with_a_short_answer():
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.3)
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the hat; the dog " * 6, chat=False)
    plain = SpeculativePipeline(
        target, NoneDrafter(), FixedBudget(k=1), GreedyComparator(), TrimRollback(), GreedyBonus()
    )
    baseline = list(plain.run(prompt, 12, stop_ids=set()))[-1].token_ids
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other")
    budget = prepared(AutoBudget(), target, drafter)
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), TrimRollback(), GreedyBonus())
    events = list(pipe.run(prompt, 12, stop_ids=set()))
    final = events[-1]
    assert isinstance(final, RunFinished)
    assert final.token_ids == baseline, first_difference(target, prompt, baseline, final.token_ids)
    logged = [e.decision.prefill for e in events if isinstance(e, Drafted) and e.decision and e.decision.prefill]
    assert len(logged) == 1 and logged[0].startswith("draft prefill ")
    choice = budget.prefill_choice
    assert choice is not None and logged[0] == choice.label()
    assert final.stats.draft_prefill == choice.label()

    class Result:  # what the CLI's summary line reads of a run
        stats, stop_reason, output_dir = final.stats, final.stop_reason, "out"

    assert f"| {choice.label()} |" in summary_line(Result())
    if choice.kind == "none":  # a same-size draft saves nothing: the draft model read nothing at all
        assert drafter.cached_len == 0 and final.stats.drafted == 0


def test_the_end_to_end_estimate_counts_the_prefill_decoding_left_out():
    # 2 s target prefill + 3 s draft prefill + 5 s decoding at ~1.6x (1.4-1.8): plain 2 + 8 = 10 s of 10 s
    whole = end_to_end(Estimate(1.6, 1.4, 1.8, "calibration"), wall_s=10.0, target_prefill_s=2.0, draft_prefill_s=3.0)
    assert whole.value == pytest.approx(1.0) and whole.low == pytest.approx(0.9) and whole.high == pytest.approx(1.1)
    assert end_to_end(Estimate(1.6), 10.0, 2.0, 0.0).value == pytest.approx((2 + 8 * 1.6) / 10)
    assert end_to_end(Estimate(), 10.0, 2.0, 3.0) == Estimate()  # no decode estimate, no end-to-end one
