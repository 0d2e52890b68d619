"""Strict plug-in construction: a config node's `_target_` called with its YAML keys plus the runtime
objects its constructor declares, nothing swallowed.

Contract: `build_plugin(node, group, **runtime)` returns the plug-in; a YAML key its constructor does not
take (a misspelled option in a user's YAML, a schema ahead of its class) raises ConfigError naming the key
and the options the plug-in has, and so does `check_plugin_keys` in preflight, before anything loads. A
`_target_` that is not one of specpipe's own plug-in classes for its group is refused before it is imported.
Runtime objects are offered per kind (`RUNTIME`) and passed only to constructors that name them; they are
never YAML keys. Builds nothing but the plug-in: constructors have no side effects (protocols.py).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf

from specpipe.config.plugin_targets import check_target
from specpipe.errors import ConfigError

# group -> runtime objects the session offers a plug-in of that kind (by constructor parameter name)
RUNTIME: dict[str, frozenset[str]] = {
    "draft": frozenset({"target", "load", "sampler", "p_min", "history"}),
    "budget": frozenset(),
    "rollback": frozenset(),
    "compare": frozenset({"sampler"}),
    "kv": frozenset(),
}
HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")


def plugin_class(node: DictConfig | dict, group: str) -> Any:
    """The class (or factory) a node's `_target_` names; ConfigError when it is not one of specpipe's own
    plug-ins for `group` (checked before anything is imported: plugin_targets.py) or cannot be imported."""
    target = node.get("_target_")
    if target is not None:
        refused = check_target(group, target)
        if refused:
            raise ConfigError(refused)
    try:
        return get_method(target) if isinstance(target, str) else None
    except Exception as exc:  # noqa: BLE001  (Hydra wraps import errors in several types)
        raise ConfigError(
            f"{group}: cannot import {target!r} ({str(exc).splitlines()[0]}): check {group}._target_"
        ) from exc


def config_parameters(factory: Any, group: str) -> list[str]:
    """The constructor parameters a YAML may set: all of them except the runtime objects."""
    runtime = RUNTIME.get(group, frozenset())
    return [p for p in inspect.signature(factory).parameters if p not in runtime]


def yaml_options(node: DictConfig | dict) -> dict[str, Any]:
    """The node's own options: Hydra's keys and the `name` label (the choice, for reports) left out."""
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    assert isinstance(values, dict)
    return {str(k): v for k, v in values.items() if k not in HYDRA_KEYS and k != "name"}


def check_plugin_keys(node: DictConfig | dict, group: str) -> str | None:
    """One line for the first YAML key the plug-in's constructor does not take; None when all fit."""
    factory = plugin_class(node, group)
    if factory is None:
        return f"{group} has no _target_: name the plug-in class, e.g. {group}=<option> from `specpipe --help`"
    known = config_parameters(factory, group)
    for key in yaml_options(node):
        if key not in known:
            has = ", ".join(known) or "no options"
            return f"unknown option {group}.{key} for {factory.__name__}: check the spelling; it takes {has}"
    return None


def build_plugin(node: DictConfig | dict, group: str, **runtime: Any) -> Any:
    """Instantiate a plug-in from its config node, offering `runtime` objects by parameter name.

    Example: build_plugin(cfg.budget, "budget") -> FixedBudget(k=8) for conf/budget/fixed.yaml;
    build_plugin(cfg.draft, "draft", target=t, load=f, sampler=s) -> NgramDrafter(min_n=1, max_n=4,
    window=4096): the n-gram constructor names none of the runtime objects, so it gets none.
    """
    message = check_plugin_keys(node, group)
    if message:
        raise ConfigError(message)
    factory = plugin_class(node, group)
    unknown = set(runtime) - RUNTIME.get(group, frozenset())
    assert not unknown, f"{group} plug-ins are not offered {sorted(unknown)}: add them to plugins.RUNTIME"
    wanted = inspect.signature(factory).parameters
    return factory(**yaml_options(node), **{k: v for k, v in runtime.items() if k in wanted})


def takes(node: DictConfig | dict, group: str, parameter: str) -> bool:
    """Whether the node's plug-in constructor declares `parameter` (e.g. a drafter's `p_min`)."""
    factory = plugin_class(node, group)
    return factory is not None and parameter in inspect.signature(factory).parameters


def check_plugins(cfg: DictConfig) -> str | None:
    """One line for the first problem of the config's plug-in nodes (an unknown key, budget=confidence
    without a drafter that takes p_min); imports each plug-in's module, loads no model."""
    for group in RUNTIME:
        node = cfg.get(group) if group in cfg else None
        if isinstance(node, (DictConfig, dict)) and "_target_" in node:
            message = check_plugin_keys(node, group)
            if message:
                return message
    return confidence_mismatch(cfg) if "budget" in cfg and "draft" in cfg else None


def confidence_mismatch(cfg: DictConfig) -> str | None:
    """A budget with a confidence floor (p_min > 0) needs a drafter whose constructor takes it."""
    p_min = cfg.budget.get("p_min", 0.0)
    if not p_min or p_min <= 0 or takes(cfg.draft, "draft", "p_min"):
        return None
    return (
        f"budget={cfg.budget.get('name')} needs a drafter with probabilities; draft={cfg.draft.get('name')} has none: "
        "use draft=model (or budget=fixed / adaptive)"
    )


if TYPE_CHECKING:  # mypy checks every plug-in class against its protocol here (tests/test_typecheck.py)
    from specpipe.budgets.adaptive import AdaptiveBudget
    from specpipe.budgets.auto import AutoBudget
    from specpipe.budgets.confidence import ConfidenceBudget
    from specpipe.budgets.fixed import FixedBudget
    from specpipe.core.protocols import Bonus, Budget, Comparator, Drafter, KvPolicy, Rollback
    from specpipe.core.stages.bonus import GreedyBonus, SampledBonus
    from specpipe.core.stages.compare import GreedyComparator, MatchComparator, RejectionComparator
    from specpipe.drafters.dflash.drafter import DFlashDrafter
    from specpipe.drafters.eagle3.drafter import Eagle3Drafter
    from specpipe.drafters.gemma4_assistant.drafter import Gemma4AssistantDrafter
    from specpipe.drafters.layerskip import LayerSkipDrafter
    from specpipe.drafters.lookahead import LookaheadDrafter
    from specpipe.drafters.model import ModelDrafter
    from specpipe.drafters.mtp import MtpDrafter
    from specpipe.drafters.ngram import NgramDrafter
    from specpipe.drafters.none import NoneDrafter
    from specpipe.drafters.sources import ChainDrafter
    from specpipe.drafters.suffix import SuffixDrafter
    from specpipe.engine.kv import FullKV, QuantizedKV, WindowKV
    from specpipe.rollbacks.auto import AutoRollback
    from specpipe.rollbacks.checkpoint import CheckpointRollback
    from specpipe.rollbacks.recompute import RecomputeRollback
    from specpipe.rollbacks.trim import TrimRollback

    _DRAFTERS: tuple[type[Drafter], ...] = (NoneDrafter, NgramDrafter, ModelDrafter, LayerSkipDrafter, MtpDrafter, LookaheadDrafter, Eagle3Drafter, DFlashDrafter, ChainDrafter, Gemma4AssistantDrafter, SuffixDrafter)  # noqa: E501  # fmt: skip
    _BUDGETS: tuple[type[Budget], ...] = (FixedBudget, AdaptiveBudget, ConfidenceBudget, AutoBudget)
    _ROLLBACKS: tuple[type[Rollback], ...] = (TrimRollback, CheckpointRollback, RecomputeRollback, AutoRollback)
    _COMPARATORS: tuple[type[Comparator], ...] = (GreedyComparator, RejectionComparator, MatchComparator)
    _BONUSES: tuple[type[Bonus], ...] = (GreedyBonus, SampledBonus)
    _KV_POLICIES: tuple[type[KvPolicy], ...] = (FullKV, QuantizedKV, WindowKV)
