"""Rollback for recurrent and hybrid models: `checkpoint`, `recompute`, `auto`.

Golden: greedy speculative output equals the target decoding alone
(draft=none), token for token, for every strategy, K and drafter (n-gram, a
noisy recurrent copy of the target, self-draft). Round trip: after a rollback
the recurrent state equals the one from decoding the accepted prefix alone.
`trim` refuses these models with one line.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import first_difference, make_drafter, noisy_copy, tiny

from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.engine import introspect
from specpipe.engine.engine import Capture, Engine
from specpipe.errors import SpecpipeError
from specpipe.events import RunFinished
from specpipe.rollbacks import layers as cache_layers
from specpipe.rollbacks.auto import AutoRollback
from specpipe.rollbacks.checkpoint import CheckpointRollback
from specpipe.rollbacks.recompute import RecomputeRollback
from specpipe.rollbacks.trim import TrimRollback

KS = [1, 2, 4, 8, 16, 32]
MAX_TOKENS = 32
STRATEGIES = {"checkpoint": CheckpointRollback, "recompute": RecomputeRollback, "auto": AutoRollback}
# One Gated DeltaNet hybrid, one Mamba2 hybrid, one pure recurrent model whose
# layers hold three slots written by two mixers (RWKV7: time + channel mixing).
MATRIX_ARCHS = ["qwen3_next", "nemotron_h", "rwkv7"]
# Every family with a stepwise hook: smoke-tested end to end, round-tripped exactly.
ALL_ARCHS = list(introspect.MIXERS)
PROMPT = "the cat sat on the mat, the cat sat on the"
# Noise on the draft copy: 0.03 gives acceptance of about 0.3-0.8 on these models,
# so rollbacks keep every length from 1 to K+1.
NOISE = 0.03


def generate(target, drafter, k: int, strategy, prompt_ids: list[int], max_tokens: int = MAX_TOKENS):
    """conftest.generate with a chosen rollback strategy: (ids, RunFinished, pipeline)."""
    pipe = SpeculativePipeline(target, drafter, FixedBudget(k=k), GreedyComparator(), strategy, GreedyBonus())
    events = list(pipe.run(prompt_ids, max_tokens, stop_ids=set()))
    final = events[-1]
    assert isinstance(final, RunFinished)
    return final.token_ids, final, pipe


_SETUPS: dict = {}


def setup_for(arch: str):
    """Target, noisy recurrent draft, prompt and the draft=none output (cached per arch)."""
    if arch not in _SETUPS:
        target = tiny(arch)
        draft = noisy_copy(target, scale=NOISE)
        prompt = target.encode_prompt(PROMPT, chat=False)
        baseline, _, _ = generate(target, make_drafter("none", target), 1, RecomputeRollback(), prompt)
        _SETUPS[arch] = target, draft, prompt, baseline
    return _SETUPS[arch]


# ---------------------------------------------------------------- golden losslessness


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("kind", ["ngram", "model", "self"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("arch", MATRIX_ARCHS)
def test_greedy_equals_target_alone(arch, strategy, kind, k):
    target, draft, prompt, baseline = setup_for(arch)
    got, final, pipe = generate(target, make_drafter(kind, target, draft), k, STRATEGIES[strategy](), prompt)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert final.stop_reason == "max_tokens"
    assert cache_layers.split(pipe.cache).recurrent, "the matrix must hold recurrent models"


@pytest.mark.parametrize("strategy", ["checkpoint", "recompute"])
@pytest.mark.parametrize("arch", [a for a in ALL_ARCHS if a not in MATRIX_ARCHS])
def test_every_supported_family_is_lossless(arch, strategy):
    target, draft, prompt, baseline = setup_for(arch)
    got, _, _ = generate(target, make_drafter("model", target, draft), 4, STRATEGIES[strategy](), prompt)
    assert got == baseline, first_difference(target, prompt, baseline, got)


def test_self_draft_accepts_everything_on_a_hybrid():
    target, _, prompt, baseline = setup_for("qwen3_next")
    strategy = CheckpointRollback()
    got, final, _ = generate(target, make_drafter("self", target), 4, strategy, prompt, 25)
    assert got == baseline[:25]
    assert final.stats.acceptance_rate == 1.0 and final.stats.acceptance_length == 5
    assert strategy.dropped == 0


# ---------------------------------------------------------------- round trip: state after rollback


def recurrent_states(cache: list) -> list:
    return [a for leaf in cache_layers.split(cache).recurrent for a in leaf.cache]


# float32 reference: decoding the kept tokens one at a time. Checkpoint restores
# states computed on that same one-token path (measured bitwise equal on CPU);
# recompute re-runs them batched, where the chunked SSD scan sums in another
# order (measured <= 4e-7 relative). 1e-5 leaves 25x margin, while restoring
# the state of a neighbouring position is off by O(1).
STATE_RTOL = 1e-5


@pytest.mark.parametrize("n_drop", [0, 1, 3, 5, 6])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_state_after_rollback_equals_decoding_the_prefix(arch, strategy, n_drop):
    engine, _, prompt, _ = setup_for(arch)
    fed = [5, 77, 140, 9, 33, 201]  # [last, d1..d5]; n_drop = 6 also drops `last` (a draft cache can)
    rollback = STRATEGIES[strategy]()
    cache = engine.make_cache()
    engine.prefill(prompt, cache)
    states = rollback.before_forward(cache)  # what the strategy needs recorded during the forward
    mx.eval(engine.forward(fed, cache, capture=Capture(states=states)).logits)
    rollback.rollback(cache, n_drop, engine=engine, fed_ids=fed)

    reference = engine.make_cache()
    engine.prefill(prompt, reference)
    for token in fed[: len(fed) - n_drop]:
        mx.eval(engine.forward([token], reference).logits)

    got, want = recurrent_states(cache), recurrent_states(reference)
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        scale = max(float(mx.max(mx.abs(b)).item()), 1e-30)
        assert float(mx.max(mx.abs(a - b)).item()) <= STATE_RTOL * scale
    for a, b in zip(cache_layers.split(cache).attention, cache_layers.split(reference).attention):
        assert a.offset == b.offset
    # ... and the next forward continues identically (logits allclose, same token)
    la, lb = engine.forward([42], cache).logits, engine.forward([42], reference).logits
    assert mx.allclose(la, lb, rtol=1e-4, atol=1e-4).item()
    assert mx.argmax(la[-1]).item() == mx.argmax(lb[-1]).item()


# ---------------------------------------------------------------- refusals and choices


def test_trim_refuses_a_hybrid_model_in_one_line():
    target, _, _, _ = setup_for("qwen3_next")
    with pytest.raises(SpecpipeError) as err:
        SpeculativePipeline(
            target, make_drafter("ngram", target), FixedBudget(k=4), GreedyComparator(), TrimRollback(), GreedyBonus()
        )
    message = str(err.value)
    assert "\n" not in message
    assert "ArraysCache" in message and "rollback=checkpoint" in message and "rollback=recompute" in message


def test_auto_trims_attention_models_and_costs_hybrids():
    llama = tiny("llama")
    prompt = llama.encode_prompt(PROMPT, chat=False)
    auto = AutoRollback()
    generate(llama, make_drafter("ngram", llama), 4, auto, prompt, 16)
    assert set(auto.choices) == {"trim"}

    target, draft, prompt, baseline = setup_for("nemotron_h")
    for k in (1, 8):
        auto = AutoRollback()
        got, _, _ = generate(target, make_drafter("model", target, draft), k, auto, prompt)
        assert got == baseline
        assert auto.choices["checkpoint"] >= 1  # the first step, before anything is known
        assert set(auto.choices) <= {"checkpoint", "recompute"}
    assert auto.choices["recompute"] > 0  # k = 8 on a model that is mostly mixer weights


def test_auto_rule():
    """checkpoint when k * mixer_fraction < reject_rate (docs/rollback.md)."""
    from specpipe.rollbacks.auto import choose

    assert choose(2, 0.31, 0.9) == "checkpoint"
    assert choose(4, 0.31, 0.9) == "recompute"
    assert choose(1, 0.01, 0.0) == "recompute"  # nothing is ever rejected: recompute costs nothing
    target, _, _, _ = setup_for("qwen3_next")
    assert 0 < introspect.mixer_fraction(target.model) < 1
    assert introspect.mixer_fraction(tiny("llama").model) == 0


def test_auto_recomputes_when_snapshots_pass_the_cap():
    target, draft, prompt, baseline = setup_for("qwen3_next")
    auto = AutoRollback(max_snapshot_mb=0.01)  # ~10 kB: a few positions of this model's state
    got, _, _ = generate(target, make_drafter("model", target, draft), 16, auto, prompt)
    assert got == baseline, first_difference(target, prompt, baseline, got)
    assert auto.choices["recompute"] > 0 and auto.recompute_tokens > 0
    assert auto.peak_bytes <= 2 * 0.01 * 2**20 + 64 * 1024  # cap on captures, plus the saved pre-forward states


def test_mixer_without_stepwise_hook_is_refused_by_checkpoint_and_recomputed_by_auto(monkeypatch):
    # As an unregistered family would be: not in the registry. Engines find their mixers once, so
    # fresh Engines over the same models look again.
    monkeypatch.setattr(introspect, "MIXERS", {m: c for m, c in introspect.MIXERS.items() if m != "qwen3_next"})
    target, draft, prompt, baseline = setup_for("qwen3_next")
    target, draft = (Engine(e.model, e.tokenizer, e.info) for e in (target, draft))
    with pytest.raises(SpecpipeError, match="rollback=recompute"):
        generate(target, make_drafter("model", target, draft), 4, CheckpointRollback(), prompt)
    auto = AutoRollback()
    got, _, _ = generate(target, make_drafter("model", target, draft), 4, auto, prompt)
    assert got == baseline
    assert auto.choices["recompute"] > 0


# ---------------------------------------------------------------- stats for summary.json


def test_stats_checkpoint_memory_grows_with_k_recompute_costs_tokens():
    target, draft, prompt, _ = setup_for("qwen3_next")
    peaks = []
    for k in (2, 8):
        strategy = CheckpointRollback()
        generate(target, make_drafter("model", target, draft), k, strategy, prompt)
        assert strategy.recompute_tokens == 0 and strategy.time_s >= 0 and strategy.dropped > 0
        peaks.append(strategy.peak_bytes)
    assert 0 < peaks[0] < peaks[1]
    recompute = RecomputeRollback()
    generate(target, make_drafter("model", target, draft), 8, recompute, prompt)
    assert recompute.recompute_tokens > 0 and recompute.time_s > 0
    assert 0 < recompute.peak_bytes < peaks[1]


# ---------------------------------------------------------------- a model folder


def test_hybrid_model_folder_round_trip(tmp_path):
    """A tiny hybrid saved with mlx-lm's own utilities loads through load_engine(path=)."""
    from mlx_lm.utils import save_config, save_model

    from specpipe.engine.load.loader import load_engine
    from specpipe.engine.load.tiny import build_tiny, byte_tokenizer

    model, config = build_tiny("qwen3_next")
    save_model(tmp_path, model)
    save_config({**config, "eos_token_id": byte_tokenizer().eos_token_id}, tmp_path / "config.json")
    byte_tokenizer().save_pretrained(tmp_path)

    folder = load_engine(path=str(tmp_path), precision="float32")
    target, _, prompt, baseline = setup_for("qwen3_next")
    got, _, _ = generate(folder, make_drafter("self", folder), 8, CheckpointRollback(), prompt)
    assert got == baseline
