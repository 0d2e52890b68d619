"""draft=gemma4_assistant as rows of a batch (batch/decoder.py over core/step.py): each row's own drafter reads
its own row of the batch's K/V storage (batch/cache.py RowKv, lent as the row joins) over its accepted prefix.
Two rows decode, two more join while they do, rows leave at different steps, the longest context passes the
64-position sliding window and the window layer frees its columns in blocks of 8: each request gets exactly
its answer alone, greedy (draft=none's tokens) and seeded sampling (the CLI pipeline's tokens for its seed),
chains and trees, and between steps each row's lent K/V equals a fresh prefill's of its context."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import pytest
from conftest import LONG_PROMPT
from gemma4_tiny import aim_at, config, random_weights, write
from test_batch_drafters import _alone, _cfg

from specpipe.batch import cache as batch_cache
from specpipe.batch.decoder import BatchDecoder, session_plugins
from specpipe.engine.engine import Capture
from specpipe.engine.target_kv import TargetKv
from specpipe.errors import SpecpipeError
from specpipe.events import Drafted
from specpipe.run.session import Session

TEXTS = [
    LONG_PROMPT + " and the cat",  # 67 ids, past the window already; 40 more tokens (no stop id among them)
    "the cat sat on the mat, the cat sat on the",
    "ab",
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return",
]
MAX_TOKENS = [40, 30, 24, 11]
SEEDS = [3, 11, 7, 5]
LATE = 3  # rows 2 and 3 join after this many steps of rows 0 and 1
WINDOW = 64
GEMMA4 = ["model=tiny-random", "model.arch=gemma4_text"]


def _session(overrides: list[str], sampled: bool) -> Session:
    sampling = ["sampling=sample", "sampling.temperature=1.0"] if sampled else []
    return Session(_cfg([*GEMMA4, *overrides, *sampling]))


@pytest.fixture(scope="module")
def plain() -> list[list[int]]:
    """draft=none's answer to each prompt alone (greedy)."""
    session = _session(["draft=none"], sampled=False)
    return [_alone(session, 0, t, m) for t, m in zip(TEXTS, MAX_TOKENS)]


@pytest.fixture(scope="module")
def folder(plain, tmp_path_factory) -> str:
    """An assistant aimed at the answers' 3 most frequent tokens: some drafts hit, some miss."""
    cfg = config()
    frequent = [t for t, _ in Counter(t for answer in plain for t in answer).most_common(3)]
    return str(write(tmp_path_factory.mktemp("assistant") / "a", cfg, aim_at(random_weights(cfg, 1), frequent, 1)))


def lent_kv_is_a_fresh_prefills(decoder: BatchDecoder) -> None:
    """Each row's drafter reads from the batch exactly the K/V one prefill of its cached context gives."""
    target = decoder.target
    for row in decoder.rows:
        n = len(row.context) - 1  # the batch holds all but the newest token
        seen = row.drafter.kv.read(n)
        fresh, cache = TargetKv(), target.make_cache()
        target.prefill(row.context[:-1], cache, Capture(kv=fresh))
        for kind, want in fresh.read(n).items():
            got = seen[kind]
            assert got.first == want.first and got.keys.shape == want.keys.shape, (kind, n)
            assert (
                mx.allclose(got.keys, want.keys, atol=1e-4).item()
                and mx.allclose(got.values, want.values, atol=1e-4).item()
            )


def batched(session: Session, seeds: list[int]) -> tuple[list[list[int]], list, list[Drafted]]:
    """The 4 requests through one BatchDecoder (two of them joining late); (each row's tokens, every row, every
    row's Drafted events)."""
    decoder = BatchDecoder(session.target, session_plugins(session))
    prompts = [session.target.encode_prompt(t, chat=False) for t in TEXTS]
    rows = [decoder.add(prompts[i], MAX_TOKENS[i], seeds[i]) for i in (0, 1)]
    steps, drafted = 0, []
    while decoder.rows:
        if steps == LATE:
            rows += [decoder.add(prompts[i], MAX_TOKENS[i], seeds[i]) for i in (2, 3)]
        report = decoder.step()
        drafted += [e for s in report.rows for e in s.events if isinstance(e, Drafted)]
        steps += 1
        lent_kv_is_a_fresh_prefills(decoder)
    return [row.output for row in rows], rows, drafted


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """The window layer frees columns in blocks of 8 (256 otherwise): the run passes the window by more."""
    monkeypatch.setattr(batch_cache, "GROW", 8)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_greedy_rows_each_get_draft_nones_answer_alone(plain, folder, tree):
    session = _session(["draft=gemma4_assistant", f"draft.path={folder}", *(["tree=dynamic"] if tree else [])], False)
    got, rows, drafted = batched(session, [0, 0, 0, 0])
    assert got == plain
    assert 0 < sum(r.accepted for r in rows) < sum(r.drafted for r in rows)  # drafts both accepted and rejected
    branched = [e.tree_parents for e in drafted if len(set(e.tree_parents)) < len(e.tree_parents)]
    assert bool(branched) == tree, "tree rows verify trees with siblings; chain rows never do"
    assert len(rows[0].context) > WINDOW + 20  # the first row's context passed the window


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_seeded_sampled_rows_each_get_their_answer_alone(folder, tree):
    session = _session(["draft=gemma4_assistant", f"draft.path={folder}", *(["tree=dynamic"] if tree else [])], True)
    got, rows, _ = batched(session, SEEDS)
    assert got == [_alone(session, s, t, m) for s, t, m in zip(SEEDS, TEXTS, MAX_TOKENS)]
    assert len({tuple(g) for g in got}) == len(got) and sum(r.drafted for r in rows) > 0


def test_a_row_that_left_lends_nothing_in_one_line(folder):
    session = _session(["draft=gemma4_assistant", f"draft.path={folder}"], False)
    decoder = BatchDecoder(session.target, session_plugins(session))
    row = decoder.add(session.target.encode_prompt(TEXTS[1], chat=False), 4)
    decoder.step()
    decoder.remove([row])
    with pytest.raises(SpecpipeError, match="left the batch") as err:
        row.drafter.kv.read(len(row.context) - 1)
    assert "\n" not in str(err.value)
