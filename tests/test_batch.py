"""Batched speculative decoding (specpipe/batch/) on tiny random models: every row's greedy tokens
equal that prompt decoded alone with draft=none, with rows joining mid-way, leaving early and
accepting different numbers of drafted tokens; sampled rows are seeded and independent of the batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from specpipe.batch.budget import AutoSettings, BatchBudget, CostTable, calibrate
from specpipe.batch.costs import cost_table
from specpipe.batch.decoder import BatchDecoder, RowStep, StepReport, refusal
from specpipe.core.sampling import Sampler
from specpipe.core.stages.bonus import GreedyBonus, SampledBonus
from specpipe.core.stages.compare import GreedyComparator, RejectionComparator
from specpipe.drafters.ngram import NgramDrafter
from specpipe.drafters.none import NoneDrafter
from specpipe.events import Drafted, Emitted, Verified
from tests.conftest import CONF_DIR, first_difference, generate, tiny

TEXTS = [
    "the cat sat on the mat, the cat sat on the",  # repetitive: n-gram drafts get accepted
    "Quick zephyrs blow, vexing daft Jim",
    "ab",  # one token of prefill
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return",
]


def served_auto_settings() -> AutoSettings:
    """What specpipe-serve budget=auto batches with: conf/budget/auto.yaml's keys and conf/serve.yaml's batch:."""
    conf = Path(CONF_DIR)
    budget = yaml.safe_load((conf / "budget" / "auto.yaml").read_text())
    batch = yaml.safe_load((conf / "serve.yaml").read_text())["batch"]
    return AutoSettings.from_config(SimpleNamespace(**budget), SimpleNamespace(**batch))


def auto(k: int, costs: CostTable, hindsight: bool = False, **changes) -> BatchBudget:
    """budget=auto over a batch as served, with `changes` to its settings (probe_every=4 ...)."""
    return BatchBudget(k, dataclasses.replace(served_auto_settings(), **changes), costs, hindsight=hindsight)


def row_step(drafted: int, accepted: int, tokens: int) -> RowStep:
    """One row's step as its events say it: `drafted` ids, `accepted` of them, `tokens` emitted."""
    return RowStep(
        row=None,
        events=[
            Drafted(step=1, k=drafted, draft_ids=[7] * drafted, seconds=0.0),
            Verified(step=1, accepted_ids=[7] * accepted, rejected_ids=[7] * (drafted - accepted), seconds=0.0),
            Emitted(step=1, token_ids=[1] * tokens, text="", from_draft=min(accepted, tokens)),
        ],
    )


def greedy_plugins(kind: str):
    def plugins(seed):
        drafter = NgramDrafter(min_n=1, max_n=3) if kind == "ngram" else NoneDrafter()
        return drafter, GreedyComparator(), GreedyBonus(), True

    return plugins


def run_batch(decoder: BatchDecoder, k: int, joins: dict[int, list[tuple[list[int], int]]], compact_every: int = 0):
    """Step until every row is done; `joins[step]` rows are added before that step. Returns rows in add order."""
    rows, step = [], 0
    while step in joins or decoder.rows or any(s > step for s in joins):
        for prompt, max_tokens in joins.get(step, []):
            rows.append(decoder.add(prompt, max_tokens))
        if decoder.rows:
            decoder.step(k)
        if compact_every and step % compact_every == 0 and decoder.rows:
            decoder.cache.compact()
        step += 1
    return rows


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def target(request):
    return tiny(request.param)


@pytest.fixture(scope="module")
def prompts(target):
    return [target.encode_prompt(t, chat=False) for t in TEXTS]


@pytest.fixture(scope="module")
def alone(target, prompts):
    """Each prompt decoded alone with draft=none, 40 tokens."""
    return [generate(target, NoneDrafter(), 1, p, 40)[0] for p in prompts]


@pytest.mark.parametrize("kind,k", [("none", 0), ("ngram", 4), ("ngram", 8)])
@pytest.mark.parametrize("compact_every", [0, 3])
def test_batched_greedy_equals_each_request_alone(target, prompts, alone, kind, k, compact_every):
    decoder = BatchDecoder(target, greedy_plugins(kind))
    decoder.stop_ids = set()
    # two rows start together, one joins at step 2 and one at step 7; max_tokens differ so rows leave at different steps
    joins = {0: [(prompts[0], 40), (prompts[1], 25)], 2: [(prompts[2], 40)], 7: [(prompts[3], 33)]}
    rows = run_batch(decoder, k, joins, compact_every)
    want = [alone[0], alone[1][:25], alone[2], alone[3][:33]]
    for row, prompt, expected in zip(rows, [prompts[0], prompts[1], prompts[2], prompts[3]], want):
        assert row.output == expected, first_difference(target, prompt, expected, row.output)
    if kind == "ngram":
        rates = [row.accepted / max(row.drafted, 1) for row in rows]
        assert max(rates) > 0 and min(rates) < 1, f"rows should accept differently: {rates}"
        assert decoder.cache.size == 0


def test_stop_token_ends_one_row_only(target, prompts, alone):
    stop = alone[0][10]
    decoder = BatchDecoder(target, greedy_plugins("ngram"))
    decoder.stop_ids = {stop}
    rows = run_batch(decoder, 4, {0: [(prompts[0], 40), (prompts[1], 40)]})
    assert rows[0].output == alone[0][: alone[0].index(stop)] and rows[0].finished == "eos"
    expected_1 = alone[1][: alone[1].index(stop)] if stop in alone[1] else alone[1]
    assert rows[1].output == expected_1


def test_a_row_removed_mid_way_leaves_the_others_exact(target, prompts, alone):
    decoder = BatchDecoder(target, greedy_plugins("ngram"))
    decoder.stop_ids = set()
    a, b, c = (decoder.add(p, 40) for p in prompts[:3])
    for step in range(12):
        if step == 4:
            decoder.remove([b])  # a client that disconnected
        decoder.step(6)
    while decoder.rows:
        decoder.step(6)
    assert a.output == alone[0] and c.output == alone[2]


def test_compaction_leaves_only_left_padding_and_keeps_positions(target, prompts):
    decoder = BatchDecoder(target, greedy_plugins("ngram"))
    decoder.stop_ids = set()
    for p in prompts[:3]:
        decoder.add(p, 40)
    for _ in range(5):
        decoder.step(8)
    cache = decoder.cache
    assert cache.holes() > 0  # rejected drafts, padding, the short prompts' left holes
    offsets, kept = cache.offsets.copy(), cache.valid[:, : cache.idx].sum(axis=1)
    cache.compact()
    assert cache.idx == kept.max() and cache.holes() == (kept.max() - kept).sum()  # only the shorter rows' left pad
    assert (cache.offsets == offsets).all() and (cache.offsets == kept).all()  # a row's position = columns it kept


def sampled_plugins(seed):
    sampler = Sampler(temperature=1.0, seed=seed)
    return NgramDrafter(min_n=1, max_n=3), RejectionComparator(sampler), SampledBonus(sampler), False


def test_sampled_rows_are_seeded_and_independent_of_the_batch(target, prompts):
    def run(with_others: bool, seed: int):
        decoder = BatchDecoder(target, lambda s: sampled_plugins(seed if s is None else s))
        decoder.stop_ids = set()
        row = decoder.add(prompts[0], 30, seed)
        if with_others:
            decoder.add(prompts[1], 30, 99)
            decoder.add(prompts[3], 12, 5)
        while decoder.rows:
            decoder.step(4)
        return row.output

    alone_7 = run(False, 7)
    assert run(True, 7) == alone_7
    assert run(False, 8) != alone_7


@pytest.mark.parametrize("arch", ["qwen3_next", "gemma3_text"])
def test_recurrent_and_sliding_window_targets_are_refused_in_one_line(arch):
    message = refusal(tiny(arch), "ngram")
    assert message and "\n" not in message and "batching needs plain attention KV caches" in message


def test_model_drafters_are_refused(target):
    assert refusal(target, "ngram") is None and refusal(target, "none") is None
    assert "draft=model" in refusal(target, "model")


# ---------------------------------------------------------------- one K for the whole batch


def assume(budget: BatchBudget, rate: float) -> None:
    """Set both acceptance rates (first token, continuation) as if 100 trials each had shown `rate`."""
    budget._first[:] = [100 * rate, 100.0]
    budget._cont[:] = [100 * rate, 100.0]


def test_two_rates_count_first_tokens_and_continuations_apart():
    budget = auto(8, table(0.0), forget=1.0, prior_alpha=0.5)
    first, cont = list(budget._first), list(budget._cont)
    budget._count([(4, 4), (4, 2), (4, 0), (0, 0)])  # the last row proposed nothing
    assert budget._first == [first[0] + 2, first[1] + 3]
    assert budget._cont == [cont[0] + 3 + 1, cont[1] + 3 + 2]
    assert budget._rows == 4 + 4 and budget._rows_with_draft == 4 + 3


def table(per_position_cost: float) -> CostTable:
    """T(B, n) = 1 + per_position_cost * B * n (ms): 0 is memory-bound, large is compute-bound."""
    batches, positions = [1, 2, 4, 8], [1, 2, 4, 8, 16, 17]
    seconds = np.array([[1 + per_position_cost * b * n for n in positions] for b in batches])
    return CostTable(batches, positions, seconds)


def test_auto_speculates_when_verifying_is_cheap_and_stops_when_compute_bound():
    cheap, bound = auto(16, table(0.005)), auto(16, table(0.5))
    for budget in (cheap, bound):
        assume(budget, 0.6)  # acceptance 0.6, every row drafting
    assert cheap.next_k(1) >= 4 and cheap.next_k(8) >= 1
    assert bound.next_k(8) == 0 and bound.last_reason == "plain"
    assert all(bound.rate(8, 0) >= bound.rate(8, k) for k in range(1, 17))


def test_auto_probes_after_plain_steps_and_learns_from_the_probe():
    budget = auto(16, table(0.5), probe_every=4, probe_k=2)
    ks = [budget.next_k(4) for _ in range(4)]
    assert ks == [0, 0, 0, 2] and budget.last_reason == "probe"
    rows = [row_step(2, 2, 3)] * 4
    alpha = budget.alpha
    budget.observe(StepReport(rows, 4, 3, 0.0, 0.0))
    assert budget.alpha > alpha


def test_calibration_times_real_forwards(target):
    costs = calibrate(target, max_batch=3, max_n=5, repeats=1)
    assert costs.batches == [1, 2, 3] and costs.positions == [1, 2, 4, 5]
    assert (costs.seconds > 0).all() and costs.time(3, 5) > 0 and "B=3" in costs.describe()


def test_auto_follows_the_runs_own_step_times():
    budget = auto(16, table(0.005))  # calibrated: verifying 17 positions is cheap
    assume(budget, 0.3)
    assert budget.next_k(4) > 0
    rows = [row_step(4, 1, 2)] * 4
    control = auto(16, table(0.005))
    assume(control, 0.3)
    for _ in range(30):  # ... but this run's speculative steps take 5x the calibrated time
        budget.observe(StepReport(rows, 4, 5, 0.0, 5 * budget.costs.time(4, 5)))
        control.observe(StepReport(rows, 4, 5, 0.0, budget.costs.time(4, 5)))  # same rows, calibrated times
    assert budget.next_k(4) == 0 and control.next_k(4) > 0


def test_a_near_tie_goes_to_plain_decoding():
    """K > 0 must beat plain by the margin: a mispriced step costs the whole batch."""
    budget = auto(16, table(0.075))  # K = 1 predicted 1.5% faster than plain
    assume(budget, 0.25)
    rates = {k: budget.rate(4, k) for k in range(17)}
    best = max(rates, key=lambda k: rates[k])
    assert best > 0 and rates[best] < rates[0] * 1.03, "the table should make drafting barely pay"
    assert budget.next_k(4) == 0 and budget.decision["reason"] == "plain"
    assert budget.decision["best_k_speedup"] == round(rates[best] / rates[0], 3)
    budget.margin = 0.0
    assert budget.next_k(4) == best and budget.decision["reason"] == "cost"


def test_hindsight_keeps_learning_on_plain_steps_without_probes():
    budget = auto(16, table(0.02), hindsight=True, probe_every=2)
    assume(budget, 0.05)  # a poor start: plain decoding
    ks, reasons = [], set()
    for _ in range(40):
        ks.append(budget.next_k(4))
        reasons.add(budget.decision["reason"])
        if ks[-1] == 0:
            assert budget.hindsight_k == budget.hindsight_len == 8
            budget.observe_hindsight([(8, 8)] * 4)  # every row guessed right
    assert ks[0] == 0 and "probe" not in reasons  # no verify spent on probes
    assert ks[-1] > 0 and reasons == {"plain", "cost"}


def test_look_back_checks_emitted_tokens_only(target, prompts, alone):
    decoder = BatchDecoder(target, greedy_plugins("ngram"))
    decoder.stop_ids = set()
    decoder.add(prompts[0], 40)  # repetitive: its n-gram guesses well
    decoder.add(prompts[2], 40)
    assert decoder.look_back(2) == []  # nothing emitted yet: the prompt is never checked
    seen = []
    for _ in range(38):
        decoder.step(0)
        seen.append(decoder.look_back(2))
    assert seen[0] == []  # one token emitted: too few to look back 2
    assert all(len(rows) == 2 and all(0 <= n <= d <= 2 for d, n in rows) for rows in seen[1:])
    assert sum(n for rows in seen for _, n in rows) > 0  # the repetitive row guesses right
    assert [r.output for r in decoder.rows] == [alone[0][:38], alone[2][:38]]  # looking back changed nothing


def test_the_cost_table_is_timed_once_then_read_from_the_cache(target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    first, where = cost_table(target, max_batch=2, max_n=3, repeats=1)
    assert where.startswith("timed now")
    again, where = cost_table(target, max_batch=2, max_n=3, repeats=1)
    assert where.startswith("cached") and again.batches == first.batches
    assert np.allclose(again.seconds, first.seconds)
    assert cost_table(target, max_batch=4, max_n=3, repeats=1)[1].startswith("timed now")  # other bounds: other file


def test_a_prompt_prefilled_between_steps_joins_exactly(target, prompts, alone):
    """Interleaved join: a long prompt is fed 3 tokens per step while another row decodes."""
    decoder = BatchDecoder(target, greedy_plugins("ngram"))
    decoder.stop_ids = set()
    first = decoder.add(prompts[1], 25)
    joining = decoder.begin(prompts[3], 33)
    steps_while_joining = 0
    while not joining.prefill(3):
        decoder.step(4)  # the active row keeps decoding: no stall for the whole prefill
        steps_while_joining += 1
    assert steps_while_joining >= (len(prompts[3]) - 1) // 3 - 1 and decoder.rows == [first]
    second = decoder.join(joining)
    while decoder.rows:
        decoder.step(4)
    assert first.output == alone[1][:25]
    assert second.output == alone[3][:33], first_difference(target, prompts[3], alone[3][:33], second.output)


def test_step_times_are_corrected_per_batch_size():
    """Speculative steps at B = 8 measured 3x the table, at B = 1 as calibrated: K = 0 at 8 rows only."""
    budget = auto(16, table(0.005))
    assume(budget, 0.5)
    assert budget.next_k(1) > 0 and budget.next_k(8) > 0
    for _ in range(10):
        for rows, factor in ((1, 1.0), (8, 3.0)):
            steps = [row_step(4, 1, 2)] * rows
            budget.observe(StepReport(steps, rows, 5, 0.0, factor * budget.costs.time(rows, 5)))
            plain = [row_step(0, 0, 1)] * rows
            budget.last_reason = "plain"
            budget.observe(StepReport(plain, rows, 1, 0.0, budget.costs.time(rows, 1)))
    assume(budget, 0.5)
    assert budget.next_k(8) == 0 and budget.next_k(1) > 0


def test_the_served_budget_reads_budget_autos_keys(tmp_path, monkeypatch):
    """specpipe-serve budget=auto batches with the budget's own probe_every / probe_k / forget / prior_alpha
    (conf/budget/auto.yaml, overridable as for a chain run) and conf/serve.yaml's batch margin."""
    from hydra import compose, initialize

    import specpipe.serve.config  # noqa: F401  (the serve schema)
    from specpipe.serve.cli import _batch_budget
    from specpipe.session import Session

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))  # the cost table is timed into a fresh cache
    overrides = ["model=tiny-random", "budget=auto", "budget.k_max=4", "budget.probe_every=5", "budget.forget=0.8"]
    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="serve", overrides=[*overrides, "max_batch=2", "batch.margin=0.07"])
    budget = _batch_budget(cfg, Session(cfg))
    assert budget.auto and budget.k == 4
    assert (budget.probe_every, budget.probe_k, budget.forget, budget.margin) == (5, 2, 0.8, 0.07)
    assert budget._first == [4 * 0.5, 4.0]  # prior_alpha 0.5, from the YAML


@pytest.mark.parametrize("option, k", [("adaptive", 4), ("confidence", 16)])
def test_a_per_request_budget_says_it_is_served_as_a_fixed_k(option, k, capsys):
    from hydra import compose, initialize

    import specpipe.serve.config  # noqa: F401
    from specpipe.serve.cli import _batch_budget

    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="serve", overrides=["model=tiny-random", f"budget={option}"])
    session = SimpleNamespace(drafter=NgramDrafter(), budget_label=lambda: f"{option}(k={k})")
    budget = _batch_budget(cfg, session)
    assert not budget.auto and budget.next_k(3) == k
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"budget={option}(k={k}) is served as a fixed K={k}" in line and "budget=auto" in line


def test_a_rows_events_are_the_chain_runs_events(target, prompts):
    """A row of the batch yields what the CLI pipeline yields for the same request, step by step (ids,
    verdicts, emitted text), and its figures are metrics.py's over those events."""
    from specpipe.events import RolledBack, RunFinished

    _, solo, solo_events, _ = generate(target, NgramDrafter(min_n=1, max_n=3), 4, prompts[0], 30)
    decoder = BatchDecoder(target, greedy_plugins("ngram"))
    decoder.stop_ids = set()
    row = decoder.add(prompts[0], 30)
    decoder.add(prompts[3], 12)  # another row in the forward changes nothing of this one's events
    events = []
    while row in decoder.rows:
        events += next(s for s in decoder.step(4).rows if s.row is row).events

    def fields(evs):
        return [
            (e.step, e.draft_ids)
            if isinstance(e, Drafted)
            else (e.step, e.accepted_ids, e.rejected_ids, e.recovered_id, e.bonus_id, e.rejected_text)
            if isinstance(e, Verified)
            else (e.step, e.token_ids, e.text, e.from_draft, e.token_texts)
            for e in evs
            if isinstance(e, (Drafted, Verified, Emitted))
        ]

    # the last step's text: the batch adds what the detokenizer still held (a character cut by max_tokens),
    # which the chain run's last Emitted leaves out; every other field of every step is the same
    ours, theirs = fields(events), fields(solo_events)
    assert ours[:-1] == theirs[:-1] and ours[-1][:2] == theirs[-1][:2] and ours[-1][2].startswith(theirs[-1][2])
    assert sum(isinstance(e, RolledBack) for e in events) == sum(isinstance(e, Verified) for e in events)
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.stop_reason == "max_tokens"
    assert finished.token_ids == solo.token_ids and finished.text.startswith(solo.text)
    for name in ("generated_tokens", "steps", "drafted", "accepted", "acceptance_rate", "tokens_per_forward"):
        assert getattr(finished.stats, name) == getattr(solo.stats, name), name
    assert finished.stats.prompt_tokens == len(prompts[0]) and finished.stats.ttft_s > 0
