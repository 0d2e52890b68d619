"""Runs that start from the prefix store (specpipe/prefix/) give exactly what a fresh run over the same full
context gives: tiny random targets of every cache kind (plain attention llama and qwen3, sliding-window gemma3,
hybrid qwen3_next, recurrent mamba2), draft=none / ngram / a draft model with the rollback each target gets
(rollback=auto: trim, or checkpoint for recurrent layers), greedy and seeded sampling. A chat-like second turn
(its prompt: turn 1's prompt + answer + new text) through the Session, a batched row joining from a stored
prefix, and a store so small that it evicts: the answers never change, and the figures say what was reused."""

from __future__ import annotations

import pytest
from hydra import compose, initialize

import specpipe.config  # noqa: F401  (registers the schemas)
from specpipe.batch.decoder import BatchDecoder, session_plugins
from specpipe.events import RunFinished
from specpipe.session import Session

ARCHS = ["llama", "qwen3", "gemma3_text", "qwen3_next", "mamba2"]
DRAFTS = {"none": ["draft=none"], "ngram": ["draft=ngram"], "model": ["draft=model", "draft.model=tiny-random"]}
TURN_1 = "the cat sat on the mat, the cat sat on the"
TURN_2 = " and then the dog sat on the mat, the dog"


def _session(arch: str, draft: str, sampled: bool, *extra: str) -> Session:
    sampling = ["sampling=sample", "sampling.temperature=1.0", "sampling.seed=5"] if sampled else []
    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(
            config_name="config",
            overrides=[
                "model=tiny-random",
                f"model.arch={arch}",
                "budget=fixed",
                "budget.k=4",
                *DRAFTS[draft],
                *sampling,
                *extra,
            ],
        )
    return Session(cfg)


def _run(session: Session, prompt: list[int], max_tokens: int = 16) -> RunFinished:
    final = list(session.generate(prompt, max_tokens))[-1]
    assert isinstance(final, RunFinished)
    return final


def _turn_2(session: Session, first: RunFinished) -> list[int]:
    """The second turn's prompt, as a chat builds it: turn 1's prompt and answer, then new text."""
    encode = session.target.encode_prompt
    return encode(TURN_1, chat=False) + list(first.token_ids) + encode(TURN_2, chat=False)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("draft", list(DRAFTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_a_second_turn_from_the_store_equals_a_fresh_run_over_the_whole_context(arch, draft, sampled):
    stored = _session(arch, draft, sampled)
    fresh = _session(arch, draft, sampled, "prefix_cache.enabled=false")
    assert stored.prefix_store is not None and fresh.prefix_store is None
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    assert first.stats.cached_tokens == 0
    prompt = _turn_2(stored, first)
    again, alone = _run(stored, prompt), _run(fresh, prompt)
    assert again.token_ids == alone.token_ids
    # turn 1's prompt at least came from the store (its answer too where the cache kind cuts exactly or the
    # answer ended on a stored boundary); what the store reused is what the run says it reused
    assert len(TURN_1) - 1 <= again.stats.cached_tokens < len(prompt)
    assert stored.prefix_store.stats.tokens_reused == again.stats.cached_tokens
    if draft != "none":  # acceptance after reuse is that of a fresh run over the same context
        assert (again.stats.drafted, again.stats.accepted) == (alone.stats.drafted, alone.stats.accepted)
        assert again.stats.drafted > 0


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_the_draft_model_resumes_from_its_own_snapshot(arch):
    """The draft model keeps its cache with the target's: a second turn prefills neither beyond the new text."""
    stored = _session(arch, "model", False)
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    prompt = _turn_2(stored, first)
    hit = stored.prefix_store.lookup(prompt)
    assert hit is not None and hit.drafter_state is not None and 0 < hit.drafter_state.length <= hit.tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_a_batched_row_joining_from_a_stored_prefix_equals_a_fresh_run(arch):
    stored = _session(arch, "ngram", False)
    fresh = _session(arch, "ngram", False, "prefix_cache.enabled=false")
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    prompt = _turn_2(stored, first)
    decoder = BatchDecoder(stored.target, session_plugins(stored), prefix_store=stored.prefix_store)
    before = stored.prefix_store.stats.tokens_reused
    row = decoder.add(prompt, 16)
    other = decoder.add(stored.target.encode_prompt("Quick zephyrs blow, vexing daft Jim", chat=False), 9)
    while decoder.rows:
        decoder.step()
    assert row.output == _run(fresh, prompt).token_ids
    reused = stored.prefix_store.stats.tokens_reused - before
    assert reused >= len(TURN_1) - 1 and row.result().stats.cached_tokens == reused
    assert other.result().stats.cached_tokens == 0
    # the finished row kept its prompt and answer (rebuilt from the batch where its layers allow): the next turn
    # reuses at least this prompt
    follow = list(row.context[:-1]) + stored.target.encode_prompt(" ok", chat=False)
    assert stored.prefix_store.lookup(follow).tokens >= len(prompt) - 1


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_a_tiny_byte_budget_evicts_without_changing_an_answer(arch):
    stored = _session(arch, "ngram", False)
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    # room for about one snapshot: every keep pushes the previous one out
    budget = stored.prefix_store.stats.bytes_held // max(1, stored.prefix_store.stats.entries) * 3 // 2
    small = _session(arch, "ngram", False, f"prefix_cache.bytes={budget}")
    fresh = _session(arch, "ngram", False, "prefix_cache.enabled=false")
    prompts = [_turn_2(stored, first), stored.target.encode_prompt("Quick zephyrs blow", chat=False)]
    prompts.append(prompts[0][:30] + prompts[1])
    for prompt in prompts + prompts:
        assert _run(small, prompt).token_ids == _run(fresh, prompt).token_ids
    assert small.prefix_store.stats.evictions > 0 and small.prefix_store.stats.bytes_held <= budget
    if arch == "llama":  # a full-KV entry serves a prompt that shares only its start (cut to it)
        assert small.prefix_store.stats.hits > 0
