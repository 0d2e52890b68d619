"""budget=auto's parts on their own: the rates model (budgets/rates.py) and the cost model (budgets/costs.py).

The policy (budgets/policy.py) is checked through AutoBudget: test_auto_*.py, test_chain_stop.py, and
test_auto_replay.py, which holds the three parts to the one-class budget's recorded plans."""

from __future__ import annotations

import pytest

from specpipe.batch.pricing import BEYOND
from specpipe.budgets.costs import DESCHEDULED, NEW_REQUEST_STEPS, Costs, monotone
from specpipe.budgets.rates import CARRY_TRIALS, PRIOR_TRIALS, Rates, counted, optimistic

# ---------------------------------------------------------------- rates


def test_a_draft_counts_its_first_token_and_each_later_one_given_the_one_before():
    first, nxt = counted([1.0, 1.0], [1.0, 1.0], drafted=4, accepted=2, forget=1.0)
    assert (first, nxt) == ([2.0, 1.0], [2.0, 2.0])  # the 2nd held given the 1st; the 3rd failed given the 2nd
    first, nxt = counted([1.0, 1.0], [1.0, 1.0], drafted=1, accepted=1, forget=0.5)
    assert nxt == [0.5, 0.5]  # a one-token draft tests no continuation, but its old evidence fades


def test_optimism_is_one_standard_error_and_never_above_one():
    assert optimistic([1.0, 1.0]) == pytest.approx(0.5 + 0.5 / 2**0.5)
    assert optimistic([10.0, 0.0]) == 1.0


def test_a_new_class_starts_from_the_pooled_rates_or_a_lookups_own():
    r = Rates(forget=0.9, prior_alpha=0.5)
    for _ in range(10):
        r.count(3, 3)  # the pooled rates: every draft held
    first, _ = r.of_class(7)
    assert sum(first) == pytest.approx(PRIOR_TRIALS) and first[0] / sum(first) == pytest.approx(r.alpha)
    lookup = Rates(forget=0.9, prior_alpha=0.5)
    lookup.lookup_classes = True
    for _ in range(10):
        lookup.count(3, 3)  # the model's drafts: a lookup class does not start from them
    first, _ = lookup.of_class(7)
    assert first[0] / sum(first) == pytest.approx(0.5)


def test_carried_rates_weigh_at_most_carry_trials():
    r = Rates(forget=0.9, prior_alpha=0.5)
    for _ in range(30):
        r.count(4, 4, evidence=2)
    alpha = r.alpha
    r.carry_in(r.learned())
    assert sum(r.first) == pytest.approx(CARRY_TRIALS) and r.alpha == pytest.approx(alpha)
    assert sum(r.classes[2][0]) == pytest.approx(CARRY_TRIALS)


def test_hold_rates_never_fall_as_the_confidence_rises():
    r = Rates(forget=0.9, prior_alpha=0.5)
    for _ in range(20):
        r.count_holds([0.9, 0.4], accepted=1)  # confident chains hold, unsure ones fail
    holds = r.hold_rates()
    assert list(holds) == sorted(holds) and holds[3] < 0.3 < holds[9]


# ---------------------------------------------------------------- costs


def test_the_curve_never_falls_as_the_verify_grows():
    assert monotone({1: 1.0, 2: 1.2, 3: 0.9, 4: 1.5}) == {1: 1.0, 2: 1.2, 3: 1.2, 4: 1.5}


def test_measured_verifies_correct_the_curve_by_their_medians():
    costs = Costs(forget=0.9)
    costs.calibrate({1: 1.0, 2: 1.1, 3: 1.2, 5: 1.4})
    for s in (0.10, 0.10, 0.90):  # one plain step descheduled: the median ignores it
        costs.observe_verify(1, s)
    for _ in range(3):
        costs.observe_verify(3, 0.15)
    assert costs.ratio[3] == pytest.approx(1.5)  # measured
    assert costs.ratio[5] == pytest.approx(1.4 * 1.5 / 1.2)  # scaled like the measured point


def test_a_batchs_price_sets_the_width_for_this_step_only():
    costs = Costs(forget=0.9)
    costs.price({n: 1.0 if n <= 3 else BEYOND for n in range(1, 34)})
    assert costs.batch_width == 2 and costs.ratio[4] == BEYOND
    costs.price(None)  # alone this step
    assert costs.batch_width is None and costs.ratio[4] < BEYOND


def test_a_descheduled_step_is_charged_its_price_and_a_new_request_keeps_little_of_the_last():
    costs = Costs(forget=1.0)
    costs.calibrate({n: 1.0 + 0.1 * (n - 1) for n in range(1, 34)})
    for _ in range(3):
        costs.observe_verify(1, 0.1)
    costs.realize(accepted=1, draft_s=0.0, verify_s=0.11, fed=2)  # 2 tokens for 1.1 plain steps
    costs.realize(accepted=1, draft_s=0.0, verify_s=0.11 * DESCHEDULED * 2, fed=2)  # descheduled: its price
    assert costs.realized(min_steps=2) == pytest.approx(4 / 2.2)
    costs.start_request()
    assert costs.realized(min_steps=NEW_REQUEST_STEPS) == pytest.approx(4 / 2.2)  # the ratio stays, its weight falls
    assert costs.realized(min_steps=NEW_REQUEST_STEPS + 0.1) is None
