"""Scripted tree steps for the tree sizer (trees/budget.py) on a real AutoBudget, timings injected.

`replay(scenario, sizer_class)` drives one sizer through `scenario.steps` steps: each step plans, sizes a
seeded random candidate tree, cuts it, accepts a seeded path through it and reports the step's seconds, and
records what the sizer decided (nodes, probe, its BudgetDecision's figures, its reach by depth). Nothing runs
a model, so the record is exact on any machine: tests/test_tree_sizer_replay.py holds today's sizer to the
record taken from the sizer before it read the budget through `Budget.tree_pricing()`."""

from __future__ import annotations

import random
from dataclasses import dataclass

from specpipe.budgets.auto import AutoBudget
from specpipe.trees.shape import TreeShape
from specpipe.trees.tree import TokenTree


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    free: bool  # n-gram-like (candidates every step, looked back on plain steps) or a drafter that pays
    slope: float  # T(n)/T(1) = 1 + slope (n - 1)
    c: float  # draft cost per level
    steps: int = 120


SCENARIOS = [
    Scenario("free-flat", 0, True, 0.02, 0.0),
    Scenario("free-mid", 1, True, 0.05, 0.0),
    Scenario("free-steep", 2, True, 0.3, 0.0),
    Scenario("paid-flat", 3, False, 0.02, 0.05),
    Scenario("paid-mid", 4, False, 0.05, 0.05),
    Scenario("paid-steep", 5, False, 0.3, 0.2),
]
SHAPE = TreeShape(kind="dynamic", nodes=12, depth=4, branching=[3] * 4)


def _candidates(rng: random.Random) -> TokenTree:
    tree, frontier = TokenTree(), [-1]
    for _ in range(SHAPE.depth):
        grown = []
        for parent in frontier:
            score = 1.0 if parent < 0 else tree.scores[parent]
            grown += [
                tree.add(rng.randrange(50), parent, score * rng.uniform(0.05, 0.95)) for _ in range(rng.randint(1, 3))
            ]
        frontier = grown[:3]
    return tree


def replay(scenario: Scenario, sizer_class, gains) -> list[list]:
    rng = random.Random(scenario.seed)
    budget = AutoBudget()
    budget.ratio = {n: 1.0 + scenario.slope * (n - 1) for n in range(1, 34)}
    budget.c = scenario.c
    sizer = sizer_class(budget, SHAPE, free=scenario.free, gains=gains)
    context, out = [rng.randrange(50) for _ in range(20)], []
    for _ in range(scenario.steps):
        candidates, accept = _candidates(rng), rng.uniform(0.2, 0.9)
        verify_s, draft_s = rng.uniform(0.01, 0.02), rng.uniform(0.0, 0.005)
        shape, probing = sizer.plan()
        sizer.hindsight(context, None)
        n, path, depth = 0, [], 0
        if shape is not None:
            selected = shape.select(candidates)
            depth = 0 if scenario.free else shape.depth
            n = sizer.size(selected, depth, probing, cache_len=len(context))
            if n == 0:
                sizer.hindsight(context, selected)
            tree, node = sizer.cut(selected, n) if n else TokenTree(), -1
            while True:  # the accepted path: each level's first child, while a seeded coin says it held
                children = [i for i, p in enumerate(tree.parents) if p == node]
                if not children or rng.random() > accept:
                    break
                node = children[0]
                path.append(node)
            sizer.observe(tree, path, draft_s, verify_s * (1 + 0.05 * n), depth if n else 0)
        else:
            sizer.observe(TokenTree(), [], 0.0, verify_s * 0.7, 0)
        d = sizer.decision
        figures = [d.k, d.reason, d.predicted, d.alpha, d.continuation, d.c, d.t_verify] if d is not None else None
        out.append([shape is not None, n, probing, figures, sorted(sizer.reach_by_depth().items())])
        context += [rng.randrange(50) for _ in range(len(path) + 1)]
    return out
