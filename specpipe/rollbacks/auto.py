"""`rollback=auto`: pick, per model and per step, the cheaper exact rollback.

Contract: same hooks as every strategy; `choices` counts what was used,
e.g. {"checkpoint": 3, "recompute": 29}. Per cache (target, draft):

1. every layer truncates (pure attention)  -> trim;
2. otherwise `choose(k, f, r)` below, from a cost model measured in
   docs/rollback.md: decoding is weight-bandwidth bound, so
   - checkpoint runs its recurrent mixers once per position, re-reading the
     mixers' weights k extra times: extra cost ~ k * f, where f is the share
     of the model's weights inside stepwise mixers (`introspect.mixer_fraction`);
   - recompute re-runs the kept tokens through the whole model on a step
     with a rejection: extra cost ~ 1 forward * r, where r is the recent
     share of steps with a rejection (0 when every draft is accepted);
   checkpoint when k * f < r, else recompute;
3. a checkpoint step whose snapshots would pass `max_snapshot_mb`, or whose
   mixers are not in introspect.MIXERS, recomputes (decided while the forward runs:
   the capture gives up and frees what it held).

The first step of a cache, before f and k are known, checkpoints. Both paths
are exact; the rule only moves time and memory.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from specpipe.core.protocols import RollbackBase
from specpipe.engine import introspect
from specpipe.engine.recurrent import StateCapture
from specpipe.rollbacks import layers as cache_layers
from specpipe.rollbacks.checkpoint import restore, take
from specpipe.rollbacks.recompute import replay

REJECT_DECAY = 0.8  # weight of the past in the running rejection share


def choose(k: int, mixer_fraction: float, reject_rate: float) -> str:
    """The cheaper strategy for a step of `k` drafts.

    Example: a hybrid with 31% of its weights in Gated DeltaNet mixers,
    rejections on 90% of steps: k = 2 -> 0.62 < 0.9 -> "checkpoint";
    k = 4 -> 1.24 >= 0.9 -> "recompute".
    """
    return "checkpoint" if k * mixer_fraction < reject_rate else "recompute"


@dataclass
class Plan:
    """What auto has learnt about one cache: inputs to `choose`."""

    k: int = 0
    mixer_fraction: float = 0.0
    reject_rate: float = 1.0


class AutoRollback(RollbackBase):
    name = "auto"

    def __init__(self, max_snapshot_mb: float = 1024.0):
        self.max_snapshot_bytes = max_snapshot_mb * 2**20
        self.dropped = 0
        self.peak_bytes = 0
        self.time_s = 0.0
        self.recompute_tokens = 0
        self.choices: Counter = Counter()
        self.last_choice = ""
        self._plans: dict[int, Plan] = {}  # id(cache list) -> Plan
        self._fractions: dict[int, float] = {}  # id(model) -> mixer fraction
        self._active: dict[int, tuple] = {}  # id(leaf) -> (leaf, StateRecord)

    def check(self, cache: list, role: str) -> None:
        cache_layers.check(cache, role, self.name)

    def before_forward(self, cache: list) -> StateCapture | None:
        """Start a record per recurrent layer; the StateCapture to pass to the forward when checkpointing, else None."""
        recurrent = cache_layers.split(cache).recurrent
        if not recurrent:
            return None
        plan = self._plans.get(id(cache))
        checkpoint = plan is None or choose(plan.k, plan.mixer_fraction, plan.reject_rate) == "checkpoint"
        # The cap is per model: split it over that model's recurrent layers. 0: keep only `before`.
        limit = self.max_snapshot_bytes / max(len(recurrent), 1) if checkpoint else 0
        states = StateCapture()
        for leaf in recurrent:
            self._active[id(leaf)] = (leaf, states.start(leaf, limit))
        return states if checkpoint else None  # a recompute step only needs `before`: no per-position work

    def rollback(self, cache: list, n_drop: int, *, engine=None, fed_ids: list[int] | None = None) -> None:
        t0 = time.perf_counter()
        layers = cache_layers.split(cache)
        held = sum(cache_layers.slot_bytes(c.arrays(), exclude=leaf.cache) for leaf, c in self._active.values())
        self.peak_bytes = max(self.peak_bytes, held)
        captures = [take(self._active, leaf) for leaf in layers.recurrent]

        if not layers.recurrent:
            choice = "trim"
            cache_layers.trim(layers.attention, n_drop)
        elif all(c is not None and c.positions() == len(fed_ids or ()) for c in captures):
            choice = "checkpoint"
            for leaf, capture in zip(layers.recurrent, captures):
                assert capture is not None  # the branch's condition
                restore(leaf, capture, n_drop, fed_ids)
            cache_layers.trim(layers.attention, n_drop)
        elif n_drop <= 0:
            choice = "recompute"  # planned recompute, all accepted: the forward's states are right
        else:
            choice = "recompute"
            if engine is None or fed_ids is None or any(c is None for c in captures):
                raise RuntimeError("rollback=auto needs before_forward(), engine= and fed_ids= to recompute")
            replay(cache, layers, [c.before for c in captures if c is not None], fed_ids, n_drop, engine)
            self.recompute_tokens += len(fed_ids) - n_drop
        if layers.recurrent:
            self._learn(cache, n_drop, engine, fed_ids)
        self.choices[choice] += 1
        self.last_choice = choice
        self.dropped += max(n_drop, 0)
        self.time_s += time.perf_counter() - t0

    def _learn(self, cache: list, n_drop: int, engine, fed_ids) -> None:
        plan = self._plans.setdefault(id(cache), Plan())
        if engine is not None:
            key = id(engine.model)
            if key not in self._fractions:
                self._fractions[key] = introspect.mixer_fraction(engine.model)
            plan.mixer_fraction = self._fractions[key]
        if fed_ids:
            plan.k = len(fed_ids) - 1
        plan.reject_rate = REJECT_DECAY * plan.reject_rate + (1 - REJECT_DECAY) * (n_drop > 0)
