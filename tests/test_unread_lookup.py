"""draft.lookup_min_n left unset (null): a request whose prefill budget=auto skipped ("none") drafts by prompt
lookup instead of decoding plain; every other request drafts exactly as with the lookup off.

Golden: greedy output equals the target decoding alone (draft=none) on an attention and a hybrid target.
"""

from __future__ import annotations

import pytest
from conftest import prepared
from test_draft_prefill_chunked import ChunkedFixed, run, setup_for

from specpipe.budgets.auto import AutoBudget
from specpipe.core.plan import DraftPrefill
from specpipe.drafters.model import ModelDrafter
from specpipe.events import Drafted, DraftPrefilled


def drafted(events) -> list[Drafted]:
    return [e for e in events if isinstance(e, Drafted)]


def skipping_auto(arch: str, lookup: int | None) -> AutoBudget:
    """budget=auto told to skip the draft model's prefill (budget.draft_prefill=none)."""
    target, draft, _, _ = setup_for(arch)
    drafter = ModelDrafter(target=target, load=lambda **_: draft, model="other", lookup_min_n=lookup)
    return prepared(AutoBudget(draft_prefill="none"), target, drafter)


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_a_request_that_read_no_prompt_drafts_by_lookup_and_stays_lossless(arch):
    target, prompt, baseline, drafter, events = run(arch, skipping_auto(arch, None), lookup=None)
    assert events[-1].token_ids == baseline
    assert [e.tokens for e in events if isinstance(e, DraftPrefilled)] == [0]  # the model read nothing
    steps = drafted(events)
    assert not any(d.draft_forwards for d in steps), "the model drafts nothing on such a request"
    if arch == "llama":  # its answer repeats itself from the 6th token: the lookup finds it
        assert sum(len(d.draft_ids) for d in steps) > 0 and events[-1].stats.accepted > 0
    # the same request with the lookup off decodes plain (what it did before the unset lookup was asked)
    _, _, _, _, off = run(arch, skipping_auto(arch, 0), lookup=0)
    assert off[-1].token_ids == baseline and not any(d.draft_ids for d in drafted(off))


def test_a_request_that_read_the_prompt_never_asks_the_unset_lookup():
    _, _, baseline, _, unset = run("llama", ChunkedFixed(4, DraftPrefill("full")), lookup=None)
    _, _, _, _, off = run("llama", ChunkedFixed(4, DraftPrefill("full")), lookup=0)
    assert unset[-1].token_ids == off[-1].token_ids == baseline
    assert [d.draft_ids for d in drafted(unset)] == [d.draft_ids for d in drafted(off)]
    assert all(d.draft_forwards for d in drafted(unset) if d.draft_ids), "every draft is the model's"
