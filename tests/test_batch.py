"""Batched speculative decoding (specpipe/batch/) on tiny random models: every row's greedy tokens
equal that prompt decoded alone with draft=none, with rows joining mid-way, leaving early and
accepting different numbers of drafted tokens; sampled rows are seeded and independent of the batch."""

from __future__ import annotations

import numpy as np
import pytest

from specpipe.batch.costs import calibrate, cost_table
from specpipe.batch.decoder import BatchDecoder, RowPlugins
from specpipe.core.sampling import Sampler
from specpipe.core.stages.bonus import GreedyBonus, SampledBonus
from specpipe.core.stages.compare import GreedyComparator, RejectionComparator
from specpipe.drafters.ngram import NgramDrafter
from specpipe.drafters.none import NoneDrafter
from specpipe.events import Drafted, Emitted, Verified
from tests.conftest import first_difference, generate, tiny

TEXTS = [
    "the cat sat on the mat, the cat sat on the",  # repetitive: n-gram drafts get accepted
    "Quick zephyrs blow, vexing daft Jim",
    "ab",  # one token of prefill
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return",
]


def greedy_plugins(kind: str):
    def plugins(seed):
        drafter = NgramDrafter(min_n=1, max_n=3) if kind == "ngram" else NoneDrafter()
        return RowPlugins(drafter, GreedyComparator(), GreedyBonus())

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
    return RowPlugins(NgramDrafter(min_n=1, max_n=3), RejectionComparator(sampler), SampledBonus(sampler), greedy=False)


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


def test_calibration_times_real_forwards(target):
    costs = calibrate(target, max_batch=3, max_n=5, repeats=1)
    assert costs.batches == [1, 2, 3] and costs.positions == [1, 2, 4, 5]
    assert (costs.seconds > 0).all() and costs.time(3, 5) > 0 and "B=3" in costs.describe()


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
