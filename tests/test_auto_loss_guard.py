"""budget=auto stops drafting where this run's own steps say drafting loses, whatever the cost model
predicts: plain steps and rare probes, so the loss is bounded by the probes'; a probe that wins brings
drafting back; a new request is judged on its own steps. Deterministic: scripted step seconds (what the
pipeline hands observe), a fixed cost curve; nothing is timed."""

from __future__ import annotations

from specpipe.budgets.auto import CARRY_TRIALS, AutoBudget
from specpipe.budgets.costs import monotone

FLAT = {n: 1.0 + 0.02 * n for n in range(1, 34)}  # the calibration says a verify is nearly free
T1 = 0.1  # a plain step's seconds


def budget(hindsight: bool = False) -> AutoBudget:
    b = AutoBudget(k_max=16, prior_alpha=0.8)
    b.ratio, b.c, b.hindsight = FLAT, 0.0, hindsight
    return b


def run(b: AutoBudget, steps: int, step_s, accepted, room: int = 1000) -> list[int]:
    """`steps` planned steps: a plain one takes T1, a drafting one of k tokens `step_s(k)` seconds and keeps
    `accepted(k)` of them. Returns each step's K.

    The cost model keeps pricing verifies from the calibration (its correction by the measured verifies is
    undone after each step): the case of a cost it does not see, which is where the guard matters (with its
    correction on, the cost model itself turns plain on these timings: test_budgets)."""
    ks = []
    for i in range(steps):
        k = b.plan(cache_len=100 + i, room=room - i).k
        ks.append(k)
        if k == 0:
            b.observe(0, 0, draft_s=0.0, verify_s=T1)
        else:
            b.observe(k, accepted(k), draft_s=0.0, verify_s=step_s(k))
        b.costs.curve = monotone(FLAT)
    return ks


def test_drafting_that_loses_on_this_run_stops_but_for_rare_probes():
    """qa-334: every fixed K lost (0.76-0.81x of plain) while the cost model priced drafts above plain; here
    each drafting step costs 3 plain steps (verify seconds the curve did not foresee) and yields 2 tokens."""
    b = budget()
    _plain(b)  # the plain timings the guard measures in
    ks = run(b, 300, lambda k: 3 * T1, lambda k: 1)
    assert b.lost and b.decision.reason in ("lost", "probe")
    drafting = [i for i, k in enumerate(ks) if k]
    assert len(drafting) <= 20, drafting  # the guard took over within a few steps; probes after that are rare
    later = [j - i for i, j in zip(drafting[8:], drafting[9:])]
    assert all(gap >= b.probe_every for gap in later), later
    # the run's speed against plain: tokens over plain steps' time; bounded near plain by the guard
    tokens = sum(2 if k else 1 for k in ks)
    time = sum(3 * T1 if k else T1 for k in ks) / T1
    assert tokens / time >= 0.9


def test_the_loss_margin_is_the_users_choice():
    """budget.loss_margin (conf/budget/auto.yaml): drafting at ~0.67x of plain stops under the packaged 0.97,
    and runs on where the user accepts down to half of plain's speed."""
    for margin, stops in ((0.97, True), (0.5, False)):
        b = budget()
        b.loss_margin = margin
        _plain(b)
        run(b, 40, lambda k: 3 * T1, lambda k: 1)
        assert b.lost is stops and (b.realized or 0) > 0.5, (margin, b.realized)


def test_a_probe_that_wins_brings_drafting_back():
    b = budget()
    _plain(b)
    run(b, 40, lambda k: 3 * T1, lambda k: 1)
    assert b.lost
    run(b, 80, lambda k: 1.2 * T1, lambda k: k)  # the text turns predictable: each draft holds
    assert not b.lost and b.realized >= b.loss_margin
    assert b.plan(cache_len=500, room=500).k > 0 and b.decision.reason != "lost"


def test_without_plain_timings_the_guard_does_not_judge():
    b = budget()
    for _ in range(30):
        k = b.plan(cache_len=100, room=900).k
        b.observe(k, 1, draft_s=0.0, verify_s=3 * T1)  # no plain step timed: no unit to judge the seconds by
    assert b.realized is None and not b.lost


def test_a_new_request_is_judged_on_its_own_steps():
    b = budget()
    _plain(b)
    run(b, 40, lambda k: 3 * T1, lambda k: 1, room=1000)
    assert b.lost
    b.start_request()  # the next question
    k = b.plan(cache_len=60, room=1000).k
    assert not b.lost and k > 0 and b.decision.reason != "lost"


def test_a_new_request_starts_from_the_last_ones_rates_as_a_light_prior():
    """SmolLM2 + n-gram on Spec-Bench: rag-547 started from the alpha (0.5-0.64) earlier questions had left at
    full weight, drafted 3-7 tokens that mostly missed, and the guard took the rest of its 35-token answer plain
    (1.01x, K = 2 1.24x). A new request's text overrides the last one's rates in a few steps, as a new
    session's does."""
    b = budget()
    _plain(b)
    run(b, 40, lambda k: 1.2 * T1, lambda k: k, room=1000)  # the last question: every draft held
    assert b.alpha > 0.9
    b.start_request()  # the next question
    b.plan(cache_len=60, room=1000)
    assert sum(b.rates.first) <= CARRY_TRIALS + 1e-9
    for _ in range(4):  # its first four drafts miss
        b.observe(4, 0, draft_s=0.0, verify_s=1.3 * T1)
    assert b.alpha < 0.5  # at the last request's full weight (~10 steps) it would still read 0.62


def test_a_new_request_probes_at_once_whatever_wait_the_last_one_reached():
    steep = {n: 1.0 + 0.3 * (n - 1) for n in range(1, 34)}  # a verify costs: at alpha ~0 the cost model says plain
    b = AutoBudget(k_max=16, prior_alpha=0.8)
    b.ratio, b.c = steep, 0.0
    ks = []
    for i in range(300):  # the last question: nothing drafted held, each probe waited twice as long
        k = b.plan(cache_len=100 + i, room=1000 - i).k
        ks.append(k)
        b.observe(k, 0, draft_s=0.0, verify_s=T1 * steep[k + 1])
    drafting = [i for i, k in enumerate(ks) if k]
    assert max(j - i for i, j in zip(drafting, drafting[1:])) >= 4 * b.probe_every, ks
    b.start_request()  # the next question
    first = [b.plan(cache_len=60 + i, room=1000 - i).k for i in range(2)]
    assert any(first), first


def test_a_free_drafter_still_looks_back_while_drafting_loses():
    b = budget(hindsight=True)
    _plain(b)
    run(b, 40, lambda k: 3 * T1, lambda k: 1)
    assert b.lost
    plans = [b.plan(cache_len=200, room=959 - i) for i in range(b.probe_every - 1)]
    assert all(p.k == 0 and p.hindsight_k > 0 and p.decision.reason == "lost" for p in plans), plans


def test_one_descheduled_step_does_not_stop_drafting_that_pays():
    """rag-521: among five drafting steps one 4-token verify took 0.43 s, six plain steps (the machine, not the
    draft), and the guard kept the rest of the answer plain while its look backs accepted 60-70%."""
    b = budget()
    _plain(b)
    ks = run(b, 6, lambda k: 1.5 * T1, lambda k: 1)  # drafting pays: 2 tokens for 1.5 plain steps
    k = b.plan(cache_len=300, room=600).k
    b.observe(k, 1, draft_s=0.0, verify_s=8 * T1)  # descheduled
    assert any(ks) and not b.lost
    run(b, 6, lambda k: 1.5 * T1, lambda k: 1)
    assert not b.lost and b.plan(cache_len=400, room=500).k > 0


def test_a_free_probe_that_found_nothing_to_draft_is_taken_again_at_the_next_step():
    """mt_bench-147 (SmolLM2 + n-gram): the guard's two probes fell where the n-gram matched nothing, each
    doubled the wait, and the answer's last 90 tokens were plain while 2-token drafts paid (K = 2 1.2x)."""
    b = budget(hindsight=True)
    ks = _lost_then_nothing_to_draft(b)
    probes = [i for i, k in enumerate(ks) if k]
    assert probes and probes == list(range(probes[0], len(ks))), ks  # each step probes until one drafts
    wait = b._probe_wait
    b.plan(cache_len=400, room=600)
    b.observe(2, 0, draft_s=0.0, verify_s=1.5 * T1)  # this one drafted, and lost: the wait doubles
    assert b._probe_wait == min(2 * wait, b.probe_max) and b.plan(cache_len=401, room=599).k == 0

    model = budget()  # a drafter whose tokens cost: a probe it did not draft is not repeated every step
    model.c = 0.3
    ks = _lost_then_nothing_to_draft(model)
    assert sum(1 for k in ks if k) <= 4, ks


def _lost_then_nothing_to_draft(b: AutoBudget) -> list[int]:
    """Drafting lost (the guard engaged), then 2 * probe_max steps where the drafter had nothing to draft."""
    _plain(b)
    run(b, 40, lambda k: 3 * T1, lambda k: 1)
    assert b.lost
    ks = []
    for i in range(2 * b.probe_max):
        ks.append(b.plan(cache_len=200 + i, room=900 - i).k)
        b.observe(0, 0, draft_s=0.0, verify_s=T1)  # nothing matched: nothing drafted
    return ks


def _plain(b: AutoBudget) -> None:
    """Three plain steps timed (a run's first token and steps the drafter had nothing for)."""
    for _ in range(3):
        b.observe(0, 0, draft_s=0.0, verify_s=T1)
