"""Every draft forward is accounted for, per run and by purpose, and budget=auto
says why it chose each K.

On a tiny model pair: draft forwards <= drafted tokens + steps (at most one
catch-up per step; the model drafter folds it into its first drafting forward),
the purposes add up to the total, and a session's second run does not count
the first run's forwards."""

from __future__ import annotations

import pytest
from conftest import first_difference, generate, make_drafter, noisy_copy, prepared, tiny

from specpipe.budgets import auto as auto_module
from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.confidence import ConfidenceBudget
from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.costmodel.calibration import interpolate
from specpipe.events import Drafted, RunFinished, Verified
from specpipe.rollbacks.trim import TrimRollback

# T(n)/T(1) as MKL measured it for the 1.5B target on a 2-core CPU: a 3-token verify costs as much as 9
MKL_LIKE = interpolate({1: 1.0, 2: 1.44, 3: 2.51, 5: 2.24, 9: 2.74, 17: 3.2, 33: 4.24})


@pytest.fixture(scope="module")
def pair():
    target = tiny("llama")
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline, *_ = generate(target, make_drafter("none", target), 1, prompt, 40)
    return target, draft, prompt, baseline


def run_twice(target, drafter, budget, prompt):
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), TrimRollback(), GreedyBonus())
    return [list(pipe.run(prompt, 40, stop_ids=set())) for _ in range(2)]


def check_accounting(events):
    final = events[-1]
    assert isinstance(final, RunFinished)
    s = final.stats
    drafted = [e for e in events if isinstance(e, Drafted)]
    assert s.draft_forwards == sum(e.forwards for e in drafted)
    parts = (
        s.draft_forwards_drafting,
        s.draft_forwards_probe,
        s.draft_forwards_catchup,
        s.draft_forwards_hindsight,
        s.draft_forwards_wasted,
    )
    assert sum(parts) == s.draft_forwards, parts
    assert s.draft_forwards <= s.drafted + s.steps
    # the drafter's decode seconds, the figure a draft's cost per token is read from, are its steps' own
    assert s.draft_s == pytest.approx(sum(e.seconds for e in drafted)) and s.draft_s > 0
    return s


@pytest.mark.parametrize("budget", ["fixed", "auto"])
def test_draft_forwards_per_run_and_by_purpose(pair, budget, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    target, draft, prompt, baseline = pair
    drafter = make_drafter("model", target, draft)
    b = FixedBudget(k=4) if budget == "fixed" else prepared(AutoBudget(), target, drafter)
    first, second = run_twice(target, drafter, b, prompt)
    for events in (first, second):
        assert events[-1].token_ids == baseline, first_difference(target, prompt, baseline, events[-1].token_ids)
        s = check_accounting(events)
        # the model drafter catches up inside its first drafting forward: nothing is spent on catch-up alone
        assert s.draft_forwards_catchup == 0
        # auto's chain stop (drafters/chain.py) may drop a token it computed: at most one wasted forward per cut
        cut = [e for e in events if isinstance(e, Drafted) and 0 < len(e.draft_ids) < e.k]
        assert all(e.wasted_forwards <= 1 for e in cut) and s.draft_forwards_wasted <= len(cut)
        # one forward per token the model drafted, none re-drafted; where auto skipped the draft's prefill, the
        # prompt lookup drafted instead (drafters/model.py, unset lookup_min_n) and that costs no forward
        looked_up = sum(len(e.draft_ids) for e in events if isinstance(e, Drafted) and e.forwards == 0)
        assert s.draft_forwards == s.drafted - looked_up + s.draft_forwards_wasted
    assert drafter.forwards == first[-1].stats.draft_forwards + second[-1].stats.draft_forwards
    # a fixed budget drafts every step: after a fully accepted draft the drafter feeds its last draft token
    # (never fed to it) beside the bonus in one forward; after a rejection only the recovered token
    if budget == "fixed":
        steps = [e for e in first if isinstance(e, (Drafted, Verified))]
        for (d0, v0), (d1, _) in zip(zip(steps[::2], steps[1::2]), zip(steps[2::2], steps[3::2])):
            full = not v0.rejected_ids and d0.draft_ids
            assert d1.catchup_tokens == (1 if full else 0)


def test_a_confidence_stop_shows_as_a_wasted_forward(pair):
    target, draft, prompt, baseline = pair
    drafter = make_drafter("model", target, draft)
    drafter.p_min = 0.9
    (events, _) = run_twice(target, drafter, ConfidenceBudget(k=16, p_min=0.9), prompt)
    assert events[-1].token_ids == baseline
    s = check_accounting(events)
    stopped = [e for e in events if isinstance(e, Drafted) and e.wasted_forwards]
    assert s.draft_forwards_wasted == len(stopped) > 0  # the forward whose token fell below p_min


def test_auto_logs_each_decision(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    target, draft, prompt, _ = pair
    drafter = make_drafter("model", target, draft)
    # the step decisions, not the prefill's: a draft the target's size repays no prefill of a short answer, and
    # budget=auto would keep it plain throughout (that choice: tests/test_prefill_price.py)
    drafter.plans_prefill = False
    events, _ = run_twice(target, drafter, prepared(AutoBudget(), target, drafter), prompt)
    steps = [e for e in events if isinstance(e, Drafted)]
    # a draft model's first step is plain, before its prefill (the first token as fast as plain decoding's)
    firsts = [e for e in steps if e.decision is not None and e.decision.reason == "first token"]
    assert firsts and all(e.step == 1 and e.k == 0 and not e.draft_ids for e in firsts)
    for e in (e for e in steps if e not in firsts):
        d = e.decision
        assert d is not None and d.reason in ("cost model", "probe", "plain", "short answer")
        assert e.k <= d.k and 0 <= d.alpha <= 1 and 0 <= d.continuation <= 1 and d.c > 0 and d.t_verify >= 1
        assert e.probe == (d.reason == "probe" and bool(e.draft_ids))
        assert (d.reason in ("plain", "short answer")) == (d.k == 0)
        if d.reason == "cost model":
            assert d.predicted > 1.0  # drafting is chosen only when the cost model says it beats plain
    assert events[-1].stats.probe_steps == sum(e.probe for e in steps)


def test_auto_does_not_sit_at_short_drafts_when_acceptance_is_high():
    """95% of drafted tokens accepted, a draft model at 0.35 of a target step, MKL's verify curve:
    K = 8-16 pays (1.3x) while K = 1-2 does not; auto must get there within a handful of steps."""
    b = AutoBudget(k_max=16)
    b.ratio, b.c = MKL_LIKE, 0.35
    ks = []
    for step in range(12):
        k = b.next_k()
        ks.append(k)
        accepted = k if step % 6 != 5 else k // 2  # every sixth draft breaks half-way: ~95% per token
        b.observe(k, accepted)
    assert ks[0] >= 1  # the first step probes instead of waiting probe_every plain steps
    assert min(ks[3:]) >= 4 and max(ks) >= 8, ks


def test_auto_probes_teach_the_continuation_rate():
    """A scheduled probe drafts at least probe_k tokens: one-token probes (tried: the cheapest draft where
    T(2) = 1.44 but T(3) = 2.51) never update the continuation rate, which stayed at its 0.5 prior and kept
    long drafts priced out for a whole 95%-acceptance run."""
    b = AutoBudget(k_max=16, probe_k=2)
    b.ratio, b.c = MKL_LIKE, 0.35
    for _ in range(30):
        b.observe(4, 0)
    g = b.continuation
    ks = []
    for _ in range(60):
        k = b.next_k()
        ks.append(k)
        b.observe(k, k)  # the text turned predictable: every probe holds
    probes = [k for k in ks if k]
    assert probes[0] >= 2 and b.continuation > g and max(ks) >= 8, ks


def test_auto_carries_rates_to_the_next_session_with_the_same_pair(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))  # conftest's fresh_auto_memory empties the carry-over
    target, draft, _, _ = pair
    drafter = make_drafter("model", target, draft)
    first = prepared(AutoBudget(), target, drafter)
    fresh = (first.alpha, first.continuation)
    for _ in range(20):
        first.observe(8, 8, draft_s=0.1, verify_s=1.0)
    second = prepared(AutoBudget(), target, drafter)
    assert second.alpha > fresh[0] and second.continuation > 0.9 and second.c == pytest.approx(first.c)
    # carried as a light prior: a few steps of new text move it
    assert sum(second.rates.first) <= auto_module.CARRY_TRIALS + 1e-9
    other = prepared(AutoBudget(), target, make_drafter("ngram", target))
    assert (other.alpha, other.continuation) == fresh  # another drafter keeps its own rates


def test_auto_corrects_a_calibration_taken_on_a_busy_machine():
    """The cached curve said T(n) = 40 T(1) for every n > 1 (SmolLM2 under MKL measured T(2) = 16 while other
    processes held the cores); the run's own verify timings say a 9-token verify costs 2 plain steps."""
    b = AutoBudget(k_max=16)
    b.ratio, b.c = {n: (1.0 if n == 1 else 40.0) for n in range(1, 34)}, 0.0
    for _ in range(20):
        b.observe(8, 8)  # a copied span: everything held
    assert b.best_k() == 0  # at 40x per verify nothing pays
    b.observe(0, 0, verify_s=0.1)  # a plain step
    b.observe(8, 8, verify_s=0.2)  # a 9-token verify
    assert b.ratio[9] == pytest.approx(2.0) and b.ratio[5] == pytest.approx(2.0)  # measured; the rest scaled
    assert b.next_k() >= 8 and b.decision.t_verify <= 2.0 + 1e-9


def test_auto_probes_again_at_once_after_a_probe_that_held():
    """One rejected first probe, then a probe that held entirely: the next step probes again instead of
    waiting twice as long (the real pair sat 16 plain steps there at 95% acceptance)."""
    b = AutoBudget(k_max=16)
    b.ratio, b.c = MKL_LIKE, 0.35
    k = b.next_k()
    b.observe(k, 0)  # the first probe is rejected
    ks = []
    for _ in range(24):
        k = b.next_k()
        ks.append(k)
        b.observe(k, k)
    first = next(i for i, k in enumerate(ks) if k)
    assert all(ks[first : first + 6]), ks  # once a probe holds, drafting does not stop
    assert max(ks) >= 8


def test_one_descheduled_plain_step_does_not_make_long_verifies_look_free():
    """Prose at 3% acceptance on a loaded machine: a plain step that took a second (descheduled) made the
    forgetting average of T(1) large, every verify looked free (T(10)/T(1) = 1.0), and auto drafted 281 tokens.
    Medians per length and a curve that never falls with n keep K at 0 there."""
    b = AutoBudget(k_max=16)
    b.ratio, b.c = {n: 1.0 + 0.05 * (n - 1) for n in range(1, 34)}, 0.0  # OpenBLAS-like: T(17) = 1.8
    for _ in range(30):
        b.observe(3, 0)  # nothing held: acceptance near 0
    for seconds in (0.03, 0.03, 1.0, 0.03, 0.03):  # one plain step was descheduled
        b.observe(0, 0, verify_s=seconds)
    b.observe(3, 0, verify_s=0.04)  # a 4-token verify
    b.observe(9, 0, verify_s=0.032)  # a 10-token verify that happened to be quick
    assert b.ratio[10] >= b.ratio[4] >= 0.04 / 0.03 - 1e-9  # longer never cheaper; the spike ignored
    b.next_k()
    assert b.decision.reason != "cost model"  # at most a scheduled probe, never a draft the model "prices"


def test_a_calibration_that_says_a_longer_verify_is_cheaper_is_not_believed():
    """A fresh calibration of a tiny model timed T(3)/T(1) = 0.69; the decision logged t_verify < 1."""
    b = AutoBudget(k_max=16)
    b.ratio = {1: 1.0, 2: 1.3, 3: 0.69, 5: 1.2, 9: 2.0, 17: 1.7, 33: 3.0}
    assert b.ratio == {1: 1.0, 2: 1.3, 3: 1.3, 5: 1.3, 9: 2.0, 17: 2.0, 33: 3.0}


def test_auto_does_not_stay_at_one_token_drafts_that_never_test_the_continuation():
    """T(2)/T(1) = 1.05 but T(3)/T(1) = 1.31 (the 1.5B at 1k tokens): with the continuation at 0.68, K = 1
    wins, and one-token drafts never update the continuation. The pair sat at K = 1 for a whole long
    document at 96% acceptance."""
    b = AutoBudget(k_max=16)
    b.ratio = interpolate({1: 1.0, 2: 1.05, 3: 1.31, 5: 1.22, 9: 1.44, 17: 1.83, 33: 2.6})
    b.c = 0.31
    b.rates.next = [2.72, 1.28]  # continuation 0.68 on four trials' evidence
    ks = []
    for _ in range(12):
        k = b.next_k()
        ks.append(k)
        b.observe(k, k)  # every draft holds
    assert max(ks[2:]) >= 8, ks


def test_auto_retests_a_continuation_that_one_token_drafts_left_untested():
    """A continuation of 0.50 on four trials' evidence (one early draft that held 2 of 3) and a first token
    accepted 92% of the time: K = 1 wins even on the optimistic continuation (0.75), and one-token drafts
    never tested it again: the real pair drafted one token for all 64 of two math answers. The untested
    evidence must fade so that a longer draft tests it within a few steps."""
    b = AutoBudget(k_max=16)
    b.ratio = interpolate({1: 1.0, 2: 1.02, 3: 1.29, 5: 1.22, 9: 1.43, 17: 1.76, 33: 2.6})
    b.c = 0.30
    b.rates.first, b.rates.next = [9.2, 0.8], [1.9, 1.9]
    ks = []
    for _ in range(16):
        k = b.next_k()
        ks.append(k)
        b.observe(k, k)  # every draft holds
    assert ks[0] == 1 and max(ks) >= 4, ks
