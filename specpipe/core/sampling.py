"""Logits processing and seeded randomness shared by drafter, comparator and
bonus, so the target distribution p and the draft distribution q are always
built the same way.

Contract: `Sampler.probs(logits)` maps [n, vocab] logits to [n, vocab]
probabilities after temperature, top-k, top-p and min-p; `Sampler.key()`
hands out the next PRNG key of a stream fixed by the seed, so one config and
seed give the same tokens run after run. Temperature 0 means greedy.
"""

from __future__ import annotations

import math

import mlx.core as mx

from specpipe.errors import SpecpipeError

SEED_MAX = 2**64 - 1  # mx.random.key takes an unsigned 64-bit seed


def check_sampling(temperature: float, top_k: int, top_p: float, min_p: float, seed: int = 0) -> str | None:
    """One line saying what is wrong with these sampling values, or None. No mlx: preflight uses it too."""
    if not math.isfinite(temperature) or temperature < 0:
        return (
            f"sampling.temperature={temperature} is {'negative' if temperature < 0 else 'not a finite number'}"
            f": use 0 (greedy) or more"
        )
    if top_k < 0:
        return f"sampling.top_k={top_k} is negative: use 0 (off) or a positive count"
    if not 0.0 < top_p <= 1.0:  # False for nan too
        return f"sampling.top_p={top_p} is out of range: use a value in (0, 1]"
    if not 0.0 <= min_p < 1.0:
        return f"sampling.min_p={min_p} is out of range: use a value in [0, 1)"
    if not 0 <= seed <= SEED_MAX:
        return f"sampling.seed={seed} is out of range: seeds are 0..{SEED_MAX} (2^64 - 1)"
    return None


class Sampler:
    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int = 0):
        message = check_sampling(temperature, top_k, top_p, min_p, seed)
        if message:
            raise SpecpipeError(message)
        self.temperature, self.top_k, self.top_p, self.min_p, self.seed = temperature, top_k, top_p, min_p, seed
        self.reset()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def reset(self) -> None:
        """Restart the random stream (each generation starts from the seed)."""
        self._key = mx.random.key(self.seed)

    def key(self) -> mx.array:
        self._key, sub = mx.random.split(self._key)
        return sub

    def probs(self, logits: mx.array) -> mx.array:
        """[n, vocab] logits -> [n, vocab] float32 probabilities (rows sum to 1)."""
        logits = logits.astype(mx.float32) / self.temperature
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = mx.sort(logits, axis=-1)[..., -self.top_k][..., None]
            logits = mx.where(logits < kth, -mx.inf, logits)
        probs = mx.softmax(logits, axis=-1)
        if self.min_p > 0:
            floor = self.min_p * mx.max(probs, axis=-1, keepdims=True)
            probs = mx.where(probs < floor, 0.0, probs)
        if self.top_p < 1.0:
            order = mx.argsort(-probs, axis=-1)
            sorted_probs = mx.take_along_axis(probs, order, axis=-1)
            # keep a token if the mass strictly before it is below top_p (the first always stays)
            before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs
            keep_sorted = before < self.top_p
            keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
            probs = mx.where(keep, probs, 0.0)
        return probs / mx.sum(probs, axis=-1, keepdims=True)

    def sample(self, probs: mx.array) -> mx.array:
        """Draw one id per row of [n, vocab] probabilities -> [n] uint32."""
        return mx.random.categorical(mx.log(probs), axis=-1, key=self.key()).astype(mx.uint32)
