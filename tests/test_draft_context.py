"""`draft.context`: a draft model that prefills and keeps only attention sinks + the prompt's last W tokens.

Golden: greedy output equals the target decoding alone (draft=none) for every window, on an attention target
and a hybrid (Gated DeltaNet) one, including windows small enough to be cut back while drafting. Equivalence:
the windowed draft proposes what a fresh draft model prefilled on the same sinks + window proposes. Config:
a bad window is refused in one line before anything loads.
"""

from __future__ import annotations

import pytest
from conftest import CONF_DIR, first_difference, make_drafter, noisy_copy, tiny
from hydra import compose, initialize_config_dir

import specpipe.config.schema  # noqa: F401  (the schemas compose needs)
from specpipe.budgets.fixed import FixedBudget
from specpipe.config.preflight import check_config
from specpipe.core.pipeline import SpeculativePipeline
from specpipe.core.plan import StepPlan
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.drafters.draft_window import DraftWindow
from specpipe.drafters.model import ModelDrafter
from specpipe.errors import SpecpipeError
from specpipe.events import RunFinished
from specpipe.rollbacks.checkpoint import CheckpointRollback
from specpipe.rollbacks.trim import TrimRollback

PROMPT = "the cat sat on the mat, the cat sat on the hat; the dog sat on the log, the dog"  # 80 ids
MAX_TOKENS = 40
# None: the whole prompt; 2 with 1 sink: cut back every 2 drafted tokens; 1000: longer than the prompt
WINDOWS = [None, 2, 8, 24, 1000]
_SETUPS: dict = {}


def setup_for(arch: str):
    """Target, noisy draft copy, prompt ids and the draft=none output (cached per arch)."""
    if arch not in _SETUPS:
        target = tiny(arch)
        draft = noisy_copy(target, scale=0.03 if arch == "qwen3_next" else 0.3)
        prompt = target.encode_prompt(PROMPT, chat=False)
        pipe = SpeculativePipeline(
            target, make_drafter("none", target), FixedBudget(k=1), GreedyComparator(), rollback(arch), GreedyBonus()
        )
        final = list(pipe.run(prompt, MAX_TOKENS, stop_ids=set()))[-1]
        _SETUPS[arch] = (target, draft, prompt, final.token_ids)
    return _SETUPS[arch]


def rollback(arch: str):
    return CheckpointRollback() if arch == "qwen3_next" else TrimRollback()


def windowed(target, draft, window: int | None, sinks: int = 4) -> ModelDrafter:
    return ModelDrafter(target=target, load=lambda **_: draft, model="other", context=window, sinks=sinks)


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
@pytest.mark.parametrize("window", WINDOWS)
def test_greedy_output_equals_the_target_alone_for_every_window(arch, window):
    target, draft, prompt, baseline = setup_for(arch)
    drafter = windowed(target, draft, window, sinks=1 if window == 2 else 4)
    pipe = SpeculativePipeline(target, drafter, FixedBudget(k=4), GreedyComparator(), rollback(arch), GreedyBonus())
    final = list(pipe.run(prompt, MAX_TOKENS, stop_ids=set()))[-1]
    assert isinstance(final, RunFinished)
    assert final.token_ids == baseline, first_difference(target, prompt, baseline, final.token_ids)
    assert final.stats.accepted > 0, "the noisy copy agrees often: some drafts must hold"
    if window is not None and window < len(prompt):
        # the cache holds the sinks and at most 2 x window recent positions, whatever the answer's length
        assert drafter.window is not None and drafter.window.skipped > 0
        assert drafter.window.cache_len(drafter.cached_len) <= drafter.window.sinks + 2 * window + 4


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_a_windowed_draft_proposes_what_a_fresh_draft_on_sinks_and_window_proposes(arch):
    target, draft, prompt, _ = setup_for(arch)
    sinks, window = 3, 10
    drafter, fresh = windowed(target, draft, window, sinks), windowed(target, draft, None)
    for d in (drafter, fresh):
        d.use_rollback(rollback(arch))
    drafter.prefill(prompt)
    # the fresh draft's prompt: the sinks, the last `window` prefilled tokens and the newest (fed by the draft)
    short = prompt[:sinks] + prompt[len(prompt) - 1 - window :]
    fresh.prefill(short)
    plan = StepPlan(k=6)
    got = drafter.propose(prompt, plan)
    expected = fresh.propose(short, plan)
    assert got.token_ids == expected.token_ids and len(got.token_ids) == 6
    assert drafter.window is not None and drafter.window.skipped == len(prompt) - 1 - sinks - window
    # after a rollback to 2 accepted drafts and the target's next token, both draft the same again
    for d, ctx in ((drafter, prompt), (fresh, short)):
        d.rollback(len(ctx) + 2)
    tail = got.token_ids[:2] + [7]
    assert drafter.propose(prompt + tail, plan).token_ids == fresh.propose(short + tail, plan).token_ids


def test_the_window_is_cut_back_to_sinks_plus_window_once_it_doubles():
    window = DraftWindow(window=3, sinks=2)
    assert window.prefill_ids(list("abcdefgh")) == list("abfgh") and window.skipped == 3
    # 8 positions stand for a..h; 3 more drafted grow the recent part from 3 to 6 = 2 x window: cut back
    assert not window.due(10) and window.due(11)
    short = DraftWindow(window=10, sinks=4)
    assert short.prefill_ids([1, 2, 3]) == [1, 2, 3] and short.skipped == 0


@pytest.mark.parametrize(
    "override, says",
    [("draft.context=0", "draft.context=0 is out of range"), ("draft.sinks=-1", "draft.sinks=-1 is out of range")],
)
def test_a_bad_window_is_one_line_before_anything_loads(override, says):
    with initialize_config_dir(version_base=None, config_dir=CONF_DIR):
        cfg = compose("config", overrides=["draft=model", "draft.model=self", override])
    message = check_config(cfg)
    assert message is not None and says in message and "\n" not in message
    with pytest.raises(SpecpipeError, match="out of range"):
        DraftWindow(window=0) if "context" in override else DraftWindow(window=8, sinks=-1)


def test_drafters_without_a_prefill_of_their_own_refuse_the_key_in_one_line():
    with initialize_config_dir(version_base=None, config_dir=CONF_DIR):
        cfg = compose("config", overrides=["draft=ngram", "+draft.context=256"])
    message = check_config(cfg)
    assert message is not None and "draft.context" in message and "\n" not in message
