"""Runs that start from the prefix store (specpipe/prefix/) give exactly what a fresh run over the same full
context gives: tiny random targets of every cache kind (plain attention llama and qwen3, sliding-window gemma3,
hybrid qwen3_next, recurrent mamba2), draft=none / ngram / a draft model with the rollback each target gets
(rollback=auto: trim, or checkpoint for recurrent layers), greedy and seeded sampling. A chat-like second turn
(its prompt: turn 1's prompt + answer + new text) through the Session, a batched row joining from a stored
prefix, and a store so small that it evicts: the answers never change, and the figures say what was reused."""

from __future__ import annotations

import pytest
from hydra import compose, initialize

import specpipe.config.schema  # noqa: F401  (registers the schemas)
from specpipe.batch.decoder import BatchDecoder, session_plugins
from specpipe.events import RunFinished
from specpipe.run.session import Session

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


def _turn_1_held(session: Session) -> int:
    """The positions turn 1's prompt leaves in the cache (all its tokens but the last): reused at least."""
    return len(session.target.encode_prompt(TURN_1, chat=False)) - 1


def _turn_2(session: Session, first: RunFinished) -> list[int]:
    """The second turn's prompt, as a chat builds it: turn 1's prompt and answer, then new text."""
    encode = session.target.encode_prompt
    return encode(TURN_1, chat=False) + list(first.token_ids) + encode(TURN_2, chat=False)


# seeded sampling with the drafters that draft (draft=none's sampled tokens go through the same sampler)
CASES = [("none", False), ("ngram", False), ("model", False), ("ngram", True), ("model", True)]


@pytest.mark.parametrize("draft, sampled", CASES, ids=[f"{d}-{'sampled' if s else 'greedy'}" for d, s in CASES])
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
    assert _turn_1_held(stored) <= again.stats.cached_tokens < len(prompt)
    assert stored.prefix_store.stats.tokens_reused == again.stats.cached_tokens
    if draft != "none":  # acceptance after reuse is that of a fresh run over the same context
        assert (again.stats.drafted, again.stats.accepted) == (alone.stats.drafted, alone.stats.accepted)
        assert again.stats.drafted > 0


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_the_draft_model_resumes_from_its_own_snapshot(arch, monkeypatch):
    """The draft model keeps its cache with the target's: on the second turn it prefills only what its snapshot
    lacks, not the whole prompt."""
    stored = _session(arch, "model", False)
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    prompt = _turn_2(stored, first)
    hit = stored.prefix_store.lookup(prompt)
    assert hit is not None and hit.drafter_state is not None and 0 < hit.drafter_state.length <= hit.tokens
    engine = stored.drafter.engine
    fed: list[int] = []
    prefill = engine.prefill
    monkeypatch.setattr(
        engine, "prefill", lambda ids, cache, *a, **k: fed.append(len(ids)) or prefill(ids, cache, *a, **k)
    )
    _run(stored, prompt)
    # (its prefill waits for the first token, so it reads the prompt and that token: len(prompt) + 1 ids)
    assert fed and sum(fed) == len(prompt) - hit.drafter_state.length


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
    assert reused >= _turn_1_held(stored) and row.result().stats.cached_tokens == reused
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
    for prompt in [*prompts, prompts[0]]:
        assert _run(small, prompt).token_ids == _run(fresh, prompt).token_ids
    assert small.prefix_store.stats.evictions > 0 and small.prefix_store.stats.bytes_held <= budget
    if arch == "llama":  # a full-KV entry serves a prompt that shares only its start (cut to it)
        assert small.prefix_store.stats.hits > 0


def test_the_summary_line_the_run_folder_and_the_chat_panel_say_what_the_store_held(tmp_path):
    """The CLI's summary line, summary.json's stats and the chat's panel carry RunStats.cached_tokens."""
    import msgspec

    from specpipe.cli.generate import summary_line
    from tui.figures import Figures

    stored = _session("llama", "ngram", False)
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    events = list(stored.generate(_turn_2(stored, first), 16))
    final = events[-1]
    assert isinstance(final, RunFinished) and final.stats.cached_tokens > 0
    s = final.stats

    class Result:
        stats, stop_reason, output_dir = s, final.stop_reason, "out"

    assert f"({s.prompt_tokens} tokens, {s.cached_tokens} from the prefix store" in summary_line(Result())
    assert msgspec.json.decode(msgspec.json.encode(s))["cached_tokens"] == s.cached_tokens
    figures = Figures()
    for event in events:
        figures.consume(event)
    assert dict(figures.rows())["cached"] == f"{s.cached_tokens} of {s.prompt_tokens} prompt"


@pytest.mark.parametrize(
    "override, words",
    [
        ("prefix_cache.bytes=-1", "prefix_cache.bytes=-1 is out of range"),
        ("prefix_cache.bytes=lots", "prefix_cache.bytes"),
        ("prefix_cache.enabled=maybe", "prefix_cache.enabled"),
        ("prefix_cache.size=3", "unknown config key 'prefix_cache.size'"),
    ],
)
def test_bad_prefix_cache_values_give_one_line(override, words):
    from specpipe.cli.argv import validate_overrides
    from specpipe.config.preflight import check_config

    message = validate_overrides([override])
    if message is None:  # well-typed: the range check before anything loads says it
        with initialize(version_base=None, config_path="../specpipe/conf"):
            message = check_config(compose(config_name="config", overrides=[override]))
    assert message is not None and words in message and "\n" not in message


def test_the_store_is_on_for_the_chat_and_server_and_off_where_repeats_are_timed():
    """A bench repeat or a tune measurement must not time a cache the previous repeat left."""
    import specpipe.serve.config  # noqa: F401  (the schemas their configs extend)
    import specpipe.tune.config  # noqa: F401

    with initialize(version_base=None, config_path="../specpipe/conf"):
        enabled = {
            name: compose(config_name=name).prefix_cache.enabled for name in ("config", "serve", "bench", "tune")
        }
    assert enabled == {"config": True, "serve": True, "bench": False, "tune": False}


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> dict:
    """Random heads (exactness needs no training), as tests/test_batch_drafters.py builds them: an EAGLE-3 head
    and a DFlash drafter for the tiny targets' 2 layers, an MTP head per target."""
    from dflash_tiny import write_drafter
    from eagle3_tiny import head_config, random_weights, write

    from specpipe.drafters.mtp_head import new_head, save_head

    root = tmp_path_factory.mktemp("heads")
    cfg = head_config()
    out = {"eagle3": str(write(root / "eagle3", "eagle", cfg, random_weights(cfg, seed=1)))}
    out["dflash"] = str(write_drafter(root / "dflash", 2, seed=1, target_layer_ids=[0, 1]))
    for arch in ("llama", "qwen3_next"):
        target = _session(arch, "none", False).target
        module, _ = new_head(target.hidden_parts()[0])
        save_head(module, root / arch, {"target": {"name": target.info.name, "sha256": target.info.sha256}})
        out[arch] = str(root / arch)
    return out


@pytest.mark.parametrize("draft", ["mtp", "eagle3", "dflash"])
@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_drafters_reading_the_targets_hidden_states_resume_with_the_kept_rows(arch, draft, heads):
    """MTP, EAGLE-3 and DFlash read rows the target's forwards recorded: the store keeps the rows of the stored
    positions with the snapshot, so a second turn drafts from the same rows a fresh run records."""
    overrides = {
        "mtp": ["draft=mtp", f"draft.head={heads[arch]}"],
        "eagle3": ["draft=eagle3", f"draft.path={heads['eagle3']}", "draft.layers=[0,1,2]"],
        "dflash": ["draft=dflash", f"draft.path={heads['dflash']}"],
    }[draft]
    DRAFTS[draft] = overrides
    try:
        stored, fresh = _session(arch, draft, False), _session(arch, draft, False, "prefix_cache.enabled=false")
    finally:
        del DRAFTS[draft]
    assert not stored.drafter.resumes_without_state
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    prompt = _turn_2(stored, first)
    again, alone = _run(stored, prompt), _run(fresh, prompt)
    assert again.token_ids == alone.token_ids
    assert again.stats.cached_tokens >= _turn_1_held(stored)
    assert (again.stats.drafted, again.stats.accepted) == (alone.stats.drafted, alone.stats.accepted)
    # the rows came with the snapshot: the drafter never ran a target forward of its own to get them
    assert stored.drafter.target_recomputes == 0


def test_a_chain_of_sources_resumes_each_and_a_cross_tokenizer_draft_says_it_prefills_itself(capsys):
    """draft=chain hands each source its own kept state (the draft model's snapshot, the n-gram re-reading the
    ids); a draft with another tokenizer cannot be keyed by the target's ids: one notice line at the session's
    start, and its answers stay those of a fresh run (the target still reuses)."""
    chain = ["draft=chain", "draft.sources=[ngram,model]", "draft.model.model=tiny-random"]
    cross = ["+model.tiny.vocab_size=512", "draft=model", "draft.model=tiny-random", "draft.vocab_map=intersection"]
    for overrides, notice in ((chain, False), (cross, True)):
        DRAFTS["case"] = overrides
        try:
            capsys.readouterr()
            stored = _session("llama", "case", False)
            assert ("prefix_cache: draft.vocab_map=intersection" in capsys.readouterr().err) == notice
            fresh = _session("llama", "case", False, "prefix_cache.enabled=false")
        finally:
            del DRAFTS["case"]
        first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
        prompt = _turn_2(stored, first)
        hit = stored.prefix_store.lookup(prompt)
        assert hit is not None and (hit.drafter_state is None) == notice
        again, alone = _run(stored, prompt), _run(fresh, prompt)
        assert again.token_ids == alone.token_ids and again.stats.cached_tokens > 0
        if notice:  # (a chain picks its source by measured seconds: its acceptance is not a fixed figure)
            assert (again.stats.drafted, again.stats.accepted) == (alone.stats.drafted, alone.stats.accepted)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_gemma4_assistant_resumes_over_the_restored_targets_kv(tmp_path, sampled):
    """A Gemma-4 assistant attends to the target's own K/V (here the restored cache's, sliding-window layers
    included) and reads its kept hidden rows: the second turn equals a fresh run, with the same acceptance."""
    from gemma4_tiny import config, random_weights, write

    cfg = config()
    folder = write(tmp_path / "assistant", cfg, random_weights(cfg, 1))
    DRAFTS["gemma4_assistant"] = ["draft=gemma4_assistant", f"draft.path={folder}"]
    try:
        stored = _session("gemma4_text", "gemma4_assistant", sampled)
        fresh = _session("gemma4_text", "gemma4_assistant", sampled, "prefix_cache.enabled=false")
    finally:
        del DRAFTS["gemma4_assistant"]
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    prompt = _turn_2(stored, first)
    again, alone = _run(stored, prompt), _run(fresh, prompt)
    assert again.token_ids == alone.token_ids and again.stats.cached_tokens >= _turn_1_held(stored)
    assert (again.stats.drafted, again.stats.accepted) == (alone.stats.drafted, alone.stats.accepted)


@pytest.mark.parametrize(
    "arch, extra",
    [
        ("llama", ["rollback=recompute"]),
        ("llama", ["tree=dynamic"]),
        ("qwen3_next", ["rollback=recompute"]),
        ("mamba2", ["rollback=checkpoint"]),
    ],
    ids=["llama-recompute", "llama-tree", "qwen3_next-recompute", "mamba2-checkpoint"],
)
def test_every_rollback_and_a_tree_leave_a_cache_the_next_turn_reuses_exactly(arch, extra):
    """The cache kept at the answer's end is whatever the run's rollback (or a tree's kept path) left: the draft
    model's and the target's, with recompute, checkpoint and trees as each target allows."""
    stored = _session(arch, "model", False, *extra)
    fresh = _session(arch, "model", False, "prefix_cache.enabled=false", *extra)
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    prompt = _turn_2(stored, first)
    again, alone = _run(stored, prompt), _run(fresh, prompt)
    assert again.token_ids == alone.token_ids and again.stats.cached_tokens >= _turn_1_held(stored)
    assert (again.stats.drafted, again.stats.accepted) == (alone.stats.drafted, alone.stats.accepted)


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_a_sampled_batched_row_from_a_stored_prefix_gets_its_seeds_answer(arch):
    stored = _session(arch, "ngram", True)
    fresh = _session(arch, "ngram", True, "prefix_cache.enabled=false")
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    prompt = _turn_2(stored, first)
    decoder = BatchDecoder(stored.target, session_plugins(stored), prefix_store=stored.prefix_store)
    row = decoder.add(prompt, 16, 11)
    decoder.add(stored.target.encode_prompt("Quick zephyrs blow", chat=False), 9, 3)
    while decoder.rows:
        decoder.step()
    fresh.sampler.seed = 11
    assert row.result().stats.cached_tokens > 0 and row.output == _run(fresh, prompt).token_ids


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_layer_skip_resumes_from_its_own_snapshot(arch):
    DRAFTS["layerskip"] = ["draft=layerskip", "draft.depth=1"]
    try:
        stored, fresh = (
            _session(arch, "layerskip", False),
            _session(arch, "layerskip", False, "prefix_cache.enabled=false"),
        )
    finally:
        del DRAFTS["layerskip"]
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    prompt = _turn_2(stored, first)
    assert stored.prefix_store.lookup(prompt).drafter_state is not None
    again, alone = _run(stored, prompt), _run(fresh, prompt)
    assert again.token_ids == alone.token_ids and again.stats.cached_tokens >= _turn_1_held(stored)
    assert (again.stats.drafted, again.stats.accepted) == (alone.stats.drafted, alone.stats.accepted)


def test_the_copy_cost_script_runs_as_documented():
    """scripts/prefix_copy_cost.py (docs/prefix_cache.md's figures), cut short on a tiny model."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "prefix_copy_cost.py"
    args = ["--tokens", "64", "--reps", "1", "--model", "tiny-random"]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ["prefill", "keep", "lookup", "join"]


def test_the_budget_prices_the_real_cache_length_after_a_reuse(monkeypatch):
    """Budget.plan's cache_len (what budget=auto prices a verify by) counts the positions taken from the store."""
    stored = _session("llama", "ngram", False)
    first = _run(stored, stored.target.encode_prompt(TURN_1, chat=False))
    prompt = _turn_2(stored, first)
    seen: list[int] = []
    plan = stored.budget.plan
    monkeypatch.setattr(
        stored.budget, "plan", lambda cache_len, *a, **k: seen.append(cache_len) or plan(cache_len, *a, **k)
    )
    again = _run(stored, prompt)
    assert again.stats.cached_tokens > 0 and seen[0] == len(prompt) - 1


def test_the_one_shot_command_keeps_no_store(tmp_path, monkeypatch):
    """`specpipe "prompt"` runs one generation: a store could only add its copies to the run's memory."""
    from specpipe.prefix.store import PrefixStore
    from specpipe.run.runner import run

    def no_copies(*_args, **_kwargs):
        raise AssertionError("the one-shot run kept a snapshot")

    monkeypatch.setattr(PrefixStore, "keep", no_copies)

    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="config", overrides=["model=tiny-random", "draft=none", "max_tokens=3"])
    result = run(cfg, out_dir=str(tmp_path / "run"))
    assert result.stats.cached_tokens == 0 and result.stats.generated_tokens == 3
