"""draft=suffix (drafters/suffix.py over drafters/suffix_store.py): the store's counts are exact under append,
truncate and eviction, stay within draft.store_tokens, and a warm store drafts an earlier answer; greedy output
equals draft=none's with the store warm from other requests (llama, qwen3, the hybrid qwen3_next, mamba2), in
the CLI pipeline and as batched server rows sharing the session's store."""

from __future__ import annotations

import pytest
from conftest import first_difference, generate, make_drafter, tiny
from hydra import compose, initialize

import specpipe.config.schema  # noqa: F401  (registers the schemas)
from specpipe.core.plan import StepPlan
from specpipe.drafters.suffix import SuffixDrafter, evidence_class
from specpipe.drafters.suffix_store import HistoryShelf, SuffixStore
from specpipe.errors import SpecpipeError


def _counts(store: SuffixStore) -> dict:
    return {key: (node.total, dict(node.counts)) for key, node in store._nodes.items()}


def _plan(k: int) -> StepPlan:
    return StepPlan(k=k)


# ---------------------------------------------------------------- the store


def test_followers_count_every_sequence():
    """The module docstring's example: (5, 6) was followed by 7 twice and 8 once."""
    store = SuffixStore(100, 1, 2)
    a, b = store.open(), store.open()
    store.append(a, [5, 6, 7])
    store.append(b, [5, 6, 8, 5, 6, 7])
    n, node = store.followers([9, 5, 6])
    assert n == 2 and node.counts == {7: 2, 8: 1} and node.total == 3
    assert node.best() == (7, 2)
    assert store.followers([9]) is None


def test_truncate_and_drop_are_exact():
    store = SuffixStore(1000, 1, 3)
    a = store.open()
    store.append(a, [1, 2, 3, 1, 2])
    before = _counts(store)
    store.append(a, [4, 1, 2, 3])
    store.truncate(a, 5)
    assert _counts(store) == before
    b = store.open()
    store.append(b, [7, 7, 1, 2])
    store.close(b)
    assert _counts(store) == before and store.tokens == 5


def test_eviction_keeps_the_store_within_store_tokens_least_recently_used_first():
    store = SuffixStore(20, 1, 4)
    seqs = []
    for i in range(12):
        seqs.append(store.open())
        store.append(seqs[-1], [i, i + 1, i + 2, i + 3, i + 4])
        assert store.tokens <= 20
    assert [store.holds(s) for s in seqs] == [False] * 8 + [True] * 4
    # what is left is exactly the counts of the 4 newest sequences (eviction forgot the others fully)
    fresh = SuffixStore(20, 1, 4)
    for i in range(8, 12):
        fresh.append(fresh.open(), [i, i + 1, i + 2, i + 3, i + 4])
    assert _counts(store) == _counts(fresh)
    # a used sequence is kept over a newer unused one
    store.touch(seqs[8])
    store.append(store.open(), [50, 51, 52, 53, 54])
    assert store.holds(seqs[8]) and not store.holds(seqs[9])


def test_a_request_longer_than_the_store_keeps_its_own_context():
    store = SuffixStore(4, 1, 2)
    a = store.open()
    store.append(a, list(range(10)))
    assert store.holds(a) and store.tokens == 10
    b = store.open()
    store.append(b, [1])
    assert not store.holds(a) and store.tokens == 1


# ---------------------------------------------------------------- the drafter


def test_a_warm_store_drafts_an_earlier_answer():
    shelf = HistoryShelf()
    earlier = SuffixDrafter(max_n=4, history=shelf)
    earlier.prefill([1, 2, 3])
    earlier.propose([1, 2, 3, 10, 11, 12, 13, 14], _plan(4))  # the answer reaches the store as it is drafted for
    now = SuffixDrafter(max_n=4, spec_factor=4.0, history=shelf)  # a later request, same session
    now.prefill([20, 11, 12])
    draft = now.propose([20, 11, 12], _plan(8))
    assert draft.token_ids == [13, 14] and draft.probs is None
    assert now.last_evidence == evidence_class(2, 1.0)
    alone = SuffixDrafter(max_n=4)  # a drafter without the session's shelf has no history
    alone.prefill([20, 11, 12])
    assert alone.propose([20, 11, 12], _plan(8)).token_ids == []


def test_each_draft_names_whether_history_or_the_context_held_it():
    """Draft.source: "history" where only an earlier request held the match's follower, "context" where this
    request's own text does (prompt lookup would have found it); the run's figures count them apart."""
    shelf = HistoryShelf()
    earlier = SuffixDrafter(max_n=4, history=shelf)
    earlier.prefill([1, 2, 3])
    earlier.propose([1, 2, 3, 10, 11, 12, 13, 14], _plan(4))
    now = SuffixDrafter(max_n=4, spec_factor=4.0, history=shelf)
    now.prefill([20, 11, 12])
    assert now.propose([20, 11, 12], _plan(8)).source == "history"
    # the same match once this request has said it itself: (11, 12) -> 13 is in its own context now
    ctx = [20, 11, 12, 13, 5, 11, 12]
    assert now.propose(ctx, _plan(8)).source == "context"
    assert now.propose([20, 30, 31], _plan(8)).source == ""  # nothing drafted names no source


def test_the_summary_line_counts_accepted_drafts_by_source():
    from types import SimpleNamespace

    from specpipe.cli.generate import summary_line
    from specpipe.events import RunStats

    stats = RunStats(
        generated_tokens=10,
        steps=4,
        drafted=12,
        accepted=9,
        drafted_by_source={"history": 8, "context": 4},
        accepted_by_source={"history": 8, "context": 1},
    )
    line = summary_line(SimpleNamespace(stats=stats, stop_reason="eos", drafter="suffix", output_dir="out"))
    assert "(9/12; history 8/8, context 1/4) |" in line, line


def test_draft_size_follows_the_match_and_the_branch_frequency():
    drafter = SuffixDrafter(max_n=8, spec_factor=1.0, min_prob=0.4)
    drafter.prefill([1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 9, 1, 2])
    # (1, 2) matched (n = 2): at most 2 tokens; 3 follows (1, 2) in both copies, then 4 both times
    assert drafter.propose([1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 9, 1, 2], _plan(8)).token_ids == [3, 4]
    # after (1, 2, 3, 4) came 5 once and 9 once: share 1/2 >= 0.4 drafts 5 ...
    ctx = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 9, 1, 2, 3, 4]
    assert drafter.propose(ctx, _plan(8)).token_ids[:1] == [5]
    # ... but a stricter floor stops before a coin flip
    strict = SuffixDrafter(max_n=8, min_prob=0.6)
    strict.prefill(ctx)
    assert strict.propose(ctx, _plan(8)).token_ids == []


def test_hindsight_does_not_see_its_own_answer():
    drafter = SuffixDrafter(max_n=4)
    ctx = [1, 2, 3, 9, 1, 2, 3]
    drafter.prefill(ctx)
    assert drafter.hindsight(ctx, 1) == [3]  # from the copy at the start: (1, 2) -> 3
    assert drafter.hindsight([5, 6, 7, 8], 2) == []  # (5, 6) was never followed before 7 arrived
    assert drafter.propose(ctx, _plan(4)).token_ids == [9, 1, 2, 3]


@pytest.mark.parametrize(
    "kwargs, key",
    [({"max_n": 65}, "draft.max_n=65"), ({"min_prob": 2.0}, "draft.min_prob=2.0"), ({"store_tokens": -1}, "-1")],
)
def test_bad_options_are_one_line(kwargs, key):
    with pytest.raises(SpecpipeError) as caught:
        SuffixDrafter(**kwargs)
    assert key in str(caught.value) and "\n" not in str(caught.value)


# ---------------------------------------------------------------- lossless with a warm store

MAX_TOKENS = 40
OTHER = "once upon a time the cat sat on the mat and the dog sat on the log"
PROMPT = "the cat sat on the mat, the cat sat on the"


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_next", "mamba2"])
def test_greedy_equals_target_alone_with_the_store_warm(arch):
    from specpipe.rollbacks.auto import AutoRollback

    target = tiny(arch)
    prompt = target.encode_prompt(PROMPT, chat=False)
    baseline, _, _, _ = generate(target, make_drafter("none", target), 1, prompt, MAX_TOKENS, rollback=AutoRollback())
    drafter = SuffixDrafter(history=HistoryShelf())
    for text in (OTHER, PROMPT):  # other requests first: the second answers this very prompt
        generate(target, drafter, 8, target.encode_prompt(text, chat=False), MAX_TOKENS, rollback=AutoRollback())
    got, final, _, _ = generate(target, drafter, 8, prompt, MAX_TOKENS, rollback=AutoRollback())
    assert got == baseline, first_difference(target, prompt, baseline, got)
    # the earlier answer was drafted back: far more accepted tokens per step than a cold store gives
    assert final.stats.accepted >= MAX_TOKENS // 2, final.stats


def _session(arch: str, overrides: list[str]):
    from specpipe.run.session import Session

    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(
            config_name="config",
            overrides=["model=tiny-random", f"model.arch={arch}", "budget=fixed", "budget.k=8", *overrides],
        )
    return Session(cfg)


def test_batched_server_rows_share_the_session_store():
    """The server's rows (session_plugins) draft from the session's history and add to it; each row's answer is
    draft=none's."""
    from specpipe.batch.decoder import BatchDecoder, session_plugins

    plain = _session("llama", ["draft=none"])
    session = _session("llama", ["draft=suffix"])
    texts = [PROMPT, OTHER, "ab"]
    prompts = [session.target.encode_prompt(t, chat=False) for t in texts]
    expected = [list(list(plain.generate(p, 24))[-1].token_ids) for p in prompts]

    def batch() -> list:
        decoder = BatchDecoder(session.target, session_plugins(session))
        rows = [decoder.add(p, 24) for p in prompts]
        while decoder.rows:
            decoder.step()
        return rows

    first = batch()
    assert [row.output for row in first] == expected
    store = session.drafter.store  # type: ignore[attr-defined]
    assert store.sequences == 3 and store.tokens >= sum(len(p) for p in prompts) + 3 * 16
    second = batch()  # the same requests again: drafted from the first batch's answers
    assert [row.output for row in second] == expected
    assert sum(r.accepted for r in second) > sum(r.accepted for r in first) + 20
    final = list(session.generate(prompts[0], 24))[-1]  # the batch-1 path (the session's own drafter) shares it
    assert list(final.token_ids) == expected[0] and final.stats.accepted >= 16


def test_tree_is_refused_in_one_line():
    with pytest.raises(SpecpipeError) as caught:
        _session("llama", ["draft=suffix", "tree=dynamic"])
    assert str(caught.value).startswith("draft=suffix cannot propose token trees")


def test_a_chain_puts_the_suffix_store_in_front_of_a_draft_model():
    """draft=chain draft.sources=[suffix,model]: the suffix source drafts from the session's history (a free
    lookup), the draft model elsewhere; the output is draft=none's."""
    plain = _session("llama", ["draft=none"])
    session = _session("llama", ["draft=chain", "draft.sources=[suffix,model]", "draft.model.model=tiny-random"])
    prompt = session.target.encode_prompt(PROMPT, chat=False)
    expected = list(list(plain.generate(prompt, 32))[-1].token_ids)
    first = list(session.generate(prompt, 32))[-1]
    again = list(session.generate(prompt, 32))[-1]  # the first answer is now the session's history
    assert list(first.token_ids) == expected and list(again.token_ids) == expected
    suffix = session.drafter.sources[0]  # type: ignore[attr-defined]
    assert suffix.name == "suffix" and suffix.store is session.history.store(200_000, 1, 16)
    assert again.stats.target_forwards < first.stats.target_forwards
    # the chain keeps the suffix source's own name for its drafts (it once wrote "suffix" over it)
    assert again.stats.accepted_by_source.get("history", 0) > 0, again.stats.drafted_by_source
    assert "suffix" not in again.stats.drafted_by_source


def test_a_thousand_requests_keep_the_store_within_store_tokens():
    """The server's case in miniature: 1,000 requests (prompt, then an answer drafted for step by step) through
    drafters sharing one shelf; the store never holds more than store_tokens, nor more trie nodes than those
    tokens can make."""
    import random

    rng = random.Random(0)
    shelf = HistoryShelf()
    cap, max_n = 1000, 4
    for _ in range(1000):
        drafter = SuffixDrafter(max_n=max_n, store_tokens=cap, history=shelf)
        context = [rng.randrange(50) for _ in range(rng.randrange(10, 50))]
        drafter.prefill(context)
        for _ in range(4):
            context += [rng.randrange(50) for _ in range(rng.randrange(1, 8))]
            drafter.propose(context, _plan(4))
            assert drafter.store.tokens <= cap
    assert len(drafter.store._nodes) <= cap * max_n
    assert drafter.store.sequences < 1000  # least recently used requests left
