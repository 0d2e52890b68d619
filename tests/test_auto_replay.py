"""budget=auto plans exactly as it did before it was split into rates, costs and a policy.

tests/data/auto_plans.json holds every plan (and every `fit` of a draft in hand) the one-class AutoBudget
returned on eight synthetic runs (tests/auto_replay.py: n-gram, draft model, MTP head and lookup-beside-a-model
drafters, good and poor acceptance, batched rows, several requests and a second session carrying the
first one's rates). Timings are injected, so the comparison needs no quiet machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from auto_replay import SCENARIOS, replay

import specpipe.budgets.rates as rates

RECORDED = json.loads((Path(__file__).parent / "data" / "auto_plans.json").read_text())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_the_split_budget_plans_as_the_one_class_did(scenario, monkeypatch):
    monkeypatch.setattr(rates, "LEARNED", {})  # no rates carried in from another test's session
    plans = replay(scenario, monkeypatch)
    recorded = RECORDED[scenario.name]
    for i, (now, then) in enumerate(zip(plans, recorded)):
        assert now == then, f"{scenario.name}: plan {i} differs"
    assert len(plans) == len(recorded)
