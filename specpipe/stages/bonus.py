"""Bonus stage: after a fully accepted draft, the target's k+1-th row is a
free extra token. Greedy takes its argmax; samplers plug in later."""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx


class Bonus(Protocol):
    def pick(self, row: mx.array) -> int:
        """`row`: [vocab] logits after the last draft token."""


class GreedyBonus:
    def pick(self, row: mx.array) -> int:
        return int(mx.argmax(row).item())
