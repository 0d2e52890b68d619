"""Values both ways between the step and its budget, checked in the source as test_seam.py checks patches.

Going down, a budget returns a StepPlan; coming back, the step hands it the Draft (its evidence class, the
drafter's top probabilities) and the batch's price comes with `plan(price=)`. So no budget keeps a drafter,
none reads a drafter's per-step state (`last_evidence`, `last_tops`, `forwards`, `cached_len`: what a kept
drafter would be read for), and nothing pushes state into a budget between calls (`price_batch`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = sorted((ROOT / "specpipe" / "budgets").glob("*.py"))
SOURCES = sorted((ROOT / "specpipe").rglob("*.py")) + sorted((ROOT / "tui").rglob("*.py"))
DRAFTER_STATE = {"last_evidence", "last_tops", "forwards", "cached_len"}


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"


def test_no_budget_keeps_a_drafter_or_reads_its_per_step_state():
    found = []
    for path in BUDGETS:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                kept = any(isinstance(t, ast.Attribute) and "drafter" in t.attr for t in node.targets)
                holds = isinstance(node.value, ast.Name) and "drafter" in node.value.id
                if kept or (holds and any(isinstance(t, ast.Attribute) for t in node.targets)):
                    found.append(f"{_where(path, node)}: keeps a drafter")
            if isinstance(node, ast.Attribute) and node.attr in DRAFTER_STATE:
                found.append(f"{_where(path, node)}: reads .{node.attr}")
    assert not found, "budgets learn from the Draft the step hands them:\n" + "\n".join(found)


def test_nothing_pushes_a_price_into_a_budget_between_calls():
    found = [
        _where(path, node)
        for path in SOURCES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Attribute, ast.FunctionDef))
        and getattr(node, "attr", getattr(node, "name", "")) == "price_batch"
    ]
    assert not found, "the batch's price is an argument of Budget.plan:\n" + "\n".join(found)


def test_the_drivers_reach_a_budget_through_its_protocol_not_by_probing():
    """core/, batch/, serve/ and trees/ read a budget's members the Budget protocol declares (context_curve
    included, None where a budget does not price), never `getattr(budget, ...)` / `hasattr(budget, ...)`."""
    drivers = [p for p in SOURCES if p.parent.name in ("core", "batch", "serve", "trees")]
    found = []
    for path in drivers:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
            ):
                probed = ast.unparse(node.args[0]) if node.args else ""
                if "budget" in probed:
                    found.append(f"{_where(path, node)}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


PLUGIN_SOURCES = [
    path
    for part in ("budgets", "drafters", "rollbacks", "trees", "costmodel", "core/stages")
    for path in sorted((ROOT / "specpipe" / part).rglob("*.py"))
] + [ROOT / "specpipe" / "advice.py"]
KINDS = ("budget", "drafter", "rollback", "comparator", "bonus", "kv_policy")


def cross_plugin_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of each read of another plug-in's attributes a protocol does not declare: probing it
    (`getattr(budget, ...)`, `hasattr(drafter, ...)`), its private members (`budget._rates`, `x._drafter`) or a
    drafter's per-step state (`drafter.last_evidence`), where the object is not `self`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            if node.args and any(kind in ast.unparse(node.args[0]) for kind in KINDS):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Attribute):
            owner = ast.unparse(node.value)
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            other = owner != "self" and any(kind in owner for kind in KINDS)
            if node.attr == "_drafter" or (other and (private or node.attr.startswith("last_"))):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_plugin_reads_another_plugins_attributes():
    """Plug-ins (and the start-of-run advice) reach each other through the protocols' members only: what a
    budget learns comes in the Draft, what a cost needs through `Budget.verify_curve` / `draft_cost`."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {expr}"
        for path in PLUGIN_SOURCES
        for line, expr in cross_plugin_reads(path.read_text())
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        'ok = getattr(budget, "calibrated", False)',
        'hasattr(self.drafter, "token_map")',
        "rates = self.budget._rates",
        "d = self._drafter",
        "e = row.drafter.last_evidence",
    ],
)
def test_the_cross_plugin_check_catches_each_form(line):
    assert cross_plugin_reads(line), line
