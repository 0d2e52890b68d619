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


PROTOCOLS = ROOT / "specpipe" / "core" / "protocols.py"
KIND_PROTOCOLS = {
    "budget": "Budget",
    "drafter": "Drafter",
    "rollback": "Rollback",
    "comparator": "Comparator",
    "bonus": "Bonus",
    "kv_policy": "KvPolicy",
}


def declared_members() -> dict[str, set[str]]:
    """Each kind's members as core/protocols.py declares them: its Protocol's, and its base class's defaults
    (`BudgetBase`, `DrafterBase`: what every plug-in of that kind has)."""
    by_class = {name: kind for kind, name in KIND_PROTOCOLS.items()}
    members: dict[str, set[str]] = {kind: set() for kind in KIND_PROTOCOLS}
    for node in ast.parse(PROTOCOLS.read_text()).body:
        kind = by_class.get(node.name.removesuffix("Base")) if isinstance(node, ast.ClassDef) else None
        if kind is None:
            continue
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                members[kind].add(item.name)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                members[kind].add(item.target.id)
            elif isinstance(item, ast.Assign):
                members[kind].update(t.id for t in item.targets if isinstance(t, ast.Name))
    return members


class _UndeclaredReads(ast.NodeVisitor):
    """Reads `<handle>.<member>` where the handle is named for a plug-in kind (`self.budget`, `row.drafter`,
    `budget`) and the member is not one its kind's protocol declares. A handle a function narrowed with
    `isinstance` or took annotated with a concrete class is that class, which mypy checks: not reported."""

    NOT_CONCRETE = {*KIND_PROTOCOLS.values(), "Any", "object", "None"}

    def __init__(self, declared: dict[str, set[str]]):
        self.declared, self.exempt, self.found = declared, [set[str]()], list[tuple[int, str]]()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        exempt = set(self.exempt[-1])
        for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            named = {n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)} if arg.annotation else set()
            if named and not named & self.NOT_CONCRETE:
                exempt.add(arg.arg)
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "isinstance":
                exempt.add(ast.unparse(call.args[0]))
        self.exempt.append(exempt)
        self.generic_visit(node)
        self.exempt.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Attribute(self, node: ast.Attribute) -> None:
        owner = node.value
        last = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
        kind = last.lstrip("_")
        if kind in self.declared and node.attr not in self.declared[kind] and ast.unparse(owner) not in self.exempt[-1]:
            self.found.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)


def undeclared_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of each read of a plug-in member its kind's protocol does not declare: such a read
    works for one class of the kind only (auto's `ratio` read by the tree sizer), and hides from mypy what the
    reader needs."""
    visitor = _UndeclaredReads(declared_members())
    visitor.visit(ast.parse(source))
    return visitor.found


def test_no_plugin_reads_a_member_its_kinds_protocol_does_not_declare():
    """The tree sizer prices trees by `Budget.tree_pricing()`, not by AutoBudget's `ratio`, `c`, `alpha`; the
    same holds between every other pair of plug-ins."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {expr}"
        for path in PLUGIN_SOURCES
        for line, expr in undeclared_reads(path.read_text())
    ]
    assert not found, "declare what is read in core/protocols.py, or pass it as a value:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source, reported",
    [
        ("ratio = self.budget.ratio", True),
        ("k = self.budget.probe_k + 1", True),
        ("due = budget.plain_timing_due()", True),
        ("s = row.drafter.sampler", True),
        ("p = self.budget.tree_pricing()", False),
        ("plan = budget.plan(1, 2)", False),
        ("def f(budget):\n    return budget.k if isinstance(budget, FixedBudget) else 0", False),
        ("def f(drafter: ModelDrafter):\n    return drafter.sampler", False),
        ("def f(drafter: Drafter):\n    return drafter.sampler", True),
    ],
)
def test_the_undeclared_member_check_catches_each_form(source, reported):
    assert bool(undeclared_reads(source)) is reported, source


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
