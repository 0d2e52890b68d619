"""Bonus stage: after a fully accepted draft (or an empty one), the target's
k+1-th row gives a token for free. Greedy takes its argmax; sampling draws
from the processed target distribution p, as plain decoding would."""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx


class Bonus(Protocol):
    def pick(self, row: mx.array) -> int:
        """`row`: [vocab] logits after the last draft token."""


class GreedyBonus:
    def __init__(self, **_runtime):
        pass

    def pick(self, row: mx.array) -> int:
        return int(mx.argmax(row).item())


class SampledBonus:
    def __init__(self, sampler, **_runtime):
        self.sampler = sampler

    def pick(self, row: mx.array) -> int:
        return int(self.sampler.sample(self.sampler.probs(row[None]))[0].item())
