"""Bonus stage: after a fully accepted draft (or an empty one), the target's
k+1-th row gives a token for free. Greedy takes its argmax; sampling draws
from the processed target distribution p, as plain decoding would."""

from __future__ import annotations

import mlx.core as mx

from specpipe.core.protocols import Bonus  # noqa: F401  (the protocol, with the other kinds')


class GreedyBonus:
    def pick(self, row: mx.array) -> int:
        return int(mx.argmax(row).item())


class SampledBonus:
    def __init__(self, sampler):
        self.sampler = sampler

    def pick(self, row: mx.array) -> int:
        return int(self.sampler.sample(self.sampler.probs(row[None]))[0].item())
