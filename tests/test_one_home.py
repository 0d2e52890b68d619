"""Every number one home: the K cap, the forgetting of acceptance estimates and their prior's weight, `pays_at`,
and the default ports.

Two copies of a number drift apart (K caps of 32 and 64, pays_at 1.03 in the bench report and 1.05 in
specpipe-tune, the web chat and specpipe-serve both on port 8000). Each is written once and read from there:
the module-level constants are checked in the source, the values through the code that uses them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize

import specpipe.config.schema  # noqa: F401  (registers the schemas)
from specpipe.bench.report import tune_pays_at, winner
from specpipe.budgets.auto import AutoBudget
from specpipe.budgets.fixed import FixedBudget
from specpipe.budgets.rates import FORGET
from specpipe.core.plan import K_MAX
from specpipe.errors import SpecpipeError
from specpipe.serve.openai_api import MAX_REQUEST_K

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "specpipe").rglob("*.py")) + sorted((ROOT / "tui").rglob("*.py"))
HOMES = {
    "K_MAX": "specpipe/core/plan.py",
    "FORGET": "specpipe/budgets/rates.py",
    "PRIOR_TRIALS": "specpipe/budgets/rates.py",  # the weight of auto's prior rates, for chains and trees alike
}


def _literal_constants(name: str) -> list[str]:
    """Where a module-level name `name` is given a number literal."""
    found = []
    for path in SOURCES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                    found.append(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("name", sorted(HOMES))
def test_each_constant_is_written_once(name):
    assert _literal_constants(name) == [HOMES[name]]


def test_every_k_has_one_cap():
    import tui.app

    assert MAX_REQUEST_K == tui.app.MAX_K == K_MAX  # a request's specpipe.k, the chat's K keys
    FixedBudget(k=K_MAX)
    AutoBudget(k_max=K_MAX)
    for build in (lambda: FixedBudget(k=K_MAX + 1), lambda: AutoBudget(k_max=K_MAX + 1)):
        with pytest.raises(SpecpipeError, match=f"choose 1..{K_MAX}"):
            build()


def test_forget_defaults_to_one_value():
    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="config", overrides=["budget=auto"])
    assert cfg.budget.forget == FORGET == AutoBudget().forget


def test_auto_budget_defaults_are_its_yaml():
    """Each AutoBudget constructor default is conf/budget/auto.yaml's value (the YAML is the home; a default
    that drifted would change what scripts and tests that build AutoBudget() measure)."""
    import inspect

    packaged = _packaged("budget/auto")
    params = inspect.signature(AutoBudget).parameters
    keys = set(packaged) - {"defaults", "_target_", "name"}
    assert keys == set(params), keys ^ set(params)
    assert {k: params[k].default for k in keys} == {k: packaged[k] for k in keys}


def _packaged(name: str) -> dict:
    return yaml.safe_load((ROOT / "specpipe" / "conf" / f"{name}.yaml").read_text())


def test_the_bench_report_and_tune_call_the_same_speed_up_a_win():
    pays_at = _packaged("tune")["pays_at"]  # specpipe-tune's
    assert tune_pays_at() == pays_at
    under = winner({"budget": "auto(k_max=16)"}, pays_at - 0.01, None)
    assert under.startswith("speculation does not pay here"), under
    assert winner({"budget": "auto(k_max=16)"}, pays_at, None).startswith("use budget=auto")


def test_the_web_chat_and_the_server_default_to_different_ports():
    from tui.cli import DEFAULT_PORT

    assert DEFAULT_PORT != _packaged("serve")["port"]
