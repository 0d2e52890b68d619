"""The tree sizer decides as it did before it read budget=auto through `Budget.tree_pricing()`.

tests/data/tree_sizer_plans.json holds every step's decision (nodes, probe, the BudgetDecision's figures, the
reach by depth) of the sizer at ac146cd, which read AutoBudget's `ratio`, `c`, `alpha`, `continuation` and
probe settings as attributes, on six scripted runs (tests/tree_replay.py: a free and a paying drafter on a
flat, a middling and a steep verify curve). Timings are injected, so the comparison needs no quiet machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tree_replay import SCENARIOS, replay

from specpipe.trees.budget import TreeGains, TreeSizer

RECORDED = json.loads((Path(__file__).parent / "data" / "tree_sizer_plans.json").read_text())
GAINS = TreeGains(min_gain=0.03, thin_gain=0.10)  # conf/tree/dynamic.yaml's


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_the_sizer_decides_as_it_did_when_it_read_autos_attributes(scenario):
    steps = json.loads(json.dumps(replay(scenario, TreeSizer, GAINS)))  # tuples as the record's lists
    recorded = RECORDED[scenario.name]
    for i, (now, then) in enumerate(zip(steps, recorded)):
        assert now == then, f"{scenario.name}: step {i} differs"
    assert len(steps) == len(recorded)
