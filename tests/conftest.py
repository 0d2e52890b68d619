"""Shared fixtures: tiny random engines, the packaged SmolLM2, and a helper
that runs the pipeline directly (no Hydra) and returns ids + final event."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

# Load the optimised BLAS (if any) before mlx, as the CLI does.
try:
    from specpipe.engine.load.blas import preload_blas

    preload_blas()
except ImportError:  # pragma: no cover
    pass

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step

from specpipe.budgets.fixed import FixedBudget
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.drafters.model import ModelDrafter
from specpipe.drafters.ngram import NgramDrafter
from specpipe.drafters.none import NoneDrafter
from specpipe.engine.engine import Engine
from specpipe.engine.load.loader import load_engine
from specpipe.events import RunFinished
from specpipe.rollbacks.auto import AutoRollback
from specpipe.rollbacks.checkpoint import CheckpointRollback
from specpipe.rollbacks.recompute import RecomputeRollback
from specpipe.rollbacks.trim import TrimRollback

CONF_DIR = os.path.join(os.path.dirname(__file__), "..", "specpipe", "conf")


def run_module(module: str, args: list[str], cwd, env: dict | None = None, timeout: float = 300):
    """`python -m module *args` in a fresh interpreter, as a user runs the console script; text output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(autouse=True)
def fresh_auto_memory(monkeypatch):
    """Each test starts budget=auto without the rates earlier tests' sessions left in this process.

    AutoBudget carries what a session learned to the next one with the same target and drafter (a light
    prior); across tests that made results depend on which files ran before (the chain-stop cut test failed
    after test_auto_evidence, test_bench and test_budgets together, on a fresh HOME)."""
    import specpipe.budgets.rates as rates

    monkeypatch.setattr(rates, "LEARNED", {})


@pytest.fixture(scope="session")
def smollm2_gguf():
    from specpipe.engine.load.model_store import model_path

    return model_path("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf):
    return load_engine("smollm2-135m", precision="float32")


def tiny(arch: str = "llama", seed: int = 0) -> Engine:
    return load_engine("tiny-random", precision="float32", arch=arch, seed=seed)


def noisy_copy(engine: Engine, scale: float, seed: int = 1, tiny: dict | None = None) -> Engine:
    """A drafter that mostly agrees with `engine`: same weights plus noise.

    `tiny`: the config overrides `engine` was built with (shapes must match).
    """
    clone = load_engine("tiny-random", precision="float32", arch=engine.info.arch, seed=0, tiny=tiny)
    key = mx.random.key(seed)
    params = []
    for path, value in tree_flatten(engine.model.parameters()):
        key, sub = mx.random.split(key)
        params.append((path, value + scale * mx.random.normal(value.shape, key=sub) * mx.std(value)))
    clone.model.load_weights(params)
    mx.eval(clone.model.parameters())
    return clone


def prepared(budget, target: Engine, drafter):
    """A budget after the session's explicit calibration step (budget=auto times the device here)."""
    budget.prepare(target, drafter)
    return budget


def make_drafter(kind: str, target: Engine, draft_engine: Engine | None = None):
    if kind == "none":
        return NoneDrafter()
    if kind == "ngram":
        return NgramDrafter(min_n=1, max_n=3)
    if kind == "lookahead":
        from specpipe.drafters.lookahead import LookaheadDrafter

        return LookaheadDrafter()
    if kind == "self":
        return ModelDrafter(target=target, load=None, model="self")
    if kind == "model":
        return ModelDrafter(target=target, load=lambda **_: draft_engine, model="other")
    raise ValueError(kind)


def pair_with_baseline(arch: str, max_tokens: int):
    """A tiny target of `arch`, a noisy copy to draft with, a repetitive prompt, and the target's
    own greedy tokens for it (draft=none): what every losslessness test compares against."""
    target = tiny(arch)
    draft = noisy_copy(target, scale=0.5)
    prompt = target.encode_prompt("the cat sat on the mat, the cat sat on the", chat=False)
    baseline, _, _, _ = generate(target, make_drafter("none", target), 1, prompt, max_tokens)
    return target, draft, prompt, baseline


# every rollback strategy by its config name
ROLLBACKS = {
    "auto": AutoRollback,
    "checkpoint": CheckpointRollback,
    "recompute": RecomputeRollback,
    "trim": TrimRollback,
}


def mlx_lm_greedy(target: Engine, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """mlx-lm's own plain greedy decoding of `prompt_ids`: what a lossless run must equal."""
    return [int(token) for token, _ in generate_step(mx.array(prompt_ids), target.model, max_tokens=max_tokens)]


LONG_PROMPT = "the cat sat on the mat; the cat sat on the hat; the dog"  # 55 ids on the tiny tokenizer


def with_mlx_reference(arch: str, max_tokens: int):
    """A tiny target of `arch`, a noisy copy to draft with, LONG_PROMPT's ids and mlx-lm's greedy tokens."""
    target = tiny(arch)
    prompt = target.encode_prompt(LONG_PROMPT, chat=False)
    return target, noisy_copy(target, scale=0.3), prompt, mlx_lm_greedy(target, prompt, max_tokens)


def generate(target: Engine, drafter, k: int, prompt_ids: list[int], max_tokens: int, stop_ids=None, rollback=None):
    """Run the pipeline (rollback=trim unless given); return (token ids, RunFinished, all events, pipeline)."""
    rollback = TrimRollback() if rollback is None else rollback
    pipe = SpeculativePipeline(target, drafter, FixedBudget(k=k), GreedyComparator(), rollback, GreedyBonus())
    events = list(pipe.run(prompt_ids, max_tokens, stop_ids=set() if stop_ids is None else stop_ids))
    final = events[-1]
    assert isinstance(final, RunFinished)
    return final.token_ids, final, events, pipe


def run_pipeline(target: Engine, drafter, prompt_ids: list[int], max_tokens: int, stop_ids=None, tree=None):
    """Like `generate` with a tree step (tree != chain): (token ids, RunFinished)."""
    pipe = SpeculativePipeline(
        target, drafter, FixedBudget(k=4), GreedyComparator(), TrimRollback(), GreedyBonus(), tree=tree
    )
    final = list(pipe.run(prompt_ids, max_tokens, stop_ids=set() if stop_ids is None else stop_ids))[-1]
    assert isinstance(final, RunFinished)
    return final.token_ids, final


def first_difference(target: Engine, prompt_ids: list[int], expected: list[int], got: list[int]) -> str:
    """Where two greedy outputs part, and the target's top-2 logit margin there."""
    i = next((j for j, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    cache = target.make_cache()
    logits = target.forward(mx.array(prompt_ids + expected[:i], dtype=mx.uint32), cache).logits[-1]
    top = mx.sort(logits)[-2:].tolist()
    return (
        f"first difference at position {i}: expected {expected[i : i + 3]}, got {got[i : i + 3]}"
        f"; top-2 margin {top[1] - top[0]:.3g}"
    )


def first_pair_counts(pipe: SpeculativePipeline, prompt: list[int], sampler, runs: int) -> Counter:
    """How often each pair of first two tokens came out of `runs` seeded runs (seeds 0..runs-1) of `pipe`: what
    the statistical tests hold against the target's exact joint."""
    counts: Counter = Counter()
    for seed in range(runs):
        sampler.seed = seed
        sampler.reset()
        final = list(pipe.run(prompt, 3, stop_ids=set()))[-1]
        counts[tuple(final.token_ids[:2])] += 1
    return counts
