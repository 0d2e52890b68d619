"""One draft budget K per step for the whole batch, from the measured cost T(B, n) of a forward.

Contract: `calibrate(target, max_batch, max_n)` times real target forwards of B rows x n positions
(a `CostTable`); `BatchBudget.next_k(rows)` returns K for the next step and `observe(report)`
learns from each step. `fixed` drafts K every step. `auto` picks the K that maximises expected
tokens per second for the batch:

    rate(K) = B * E(K) / T(B, 1 + K),   E(K) = rho * (1 - a^(K+1)) / (1 - a) + (1 - rho)

where a is the batch's acceptance rate (per drafted token) and rho the share of rows whose drafter
proposed something (n-gram finds no match on some rows). Once the batch is compute-bound, T(B, n)
grows with n about as fast as E(K) and K = 0 (plain decoding) wins. While K = 0 the rates are not
observed, so every `probe_every` plain steps one step drafts `probe_k` tokens to look again.
The calibration is corrected by the run's own step times: T(B, n) is scaled by the decayed mean of
measured / calibrated seconds, kept apart for plain steps (n = 1) and speculative ones (n > 1), so a
neighbour that slows the machine after start-up changes K too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from specpipe.batch.cache import RaggedBatch

CALIBRATION_CONTEXT = 128  # tokens of context per row while timing


@dataclass
class CostTable:
    """Seconds of one target forward for B rows x n positions, measured on this machine."""

    batches: list[int]
    positions: list[int]
    seconds: np.ndarray  # [len(batches), len(positions)]

    def time(self, rows: int, n: int) -> float:
        """T(rows, n), linear between measured points (and beyond the last, by its slope)."""
        per_b = [
            np.interp(n, self.positions, row)
            if n <= self.positions[-1]
            else row[-1] + (n - self.positions[-1]) * (row[-1] - row[-2]) / (self.positions[-1] - self.positions[-2])
            for row in self.seconds
        ]
        return float(np.interp(rows, self.batches, per_b))

    def describe(self) -> str:
        """e.g. 'T(B, n)/T(1, 1): B=1 [1.0 1.1 1.3], B=4 [2.1 ...] for n=[1, 4, 16]'"""
        base = self.seconds[0, 0]
        rows = ", ".join(
            f"B={b} [{' '.join(f'{t / base:.1f}' for t in r)}]" for b, r in zip(self.batches, self.seconds)
        )
        return f"T(B, n)/T(1, 1) for n={self.positions}: {rows}"


def calibrate(target, max_batch: int, max_n: int, repeats: int = 5) -> CostTable:
    """Time real forwards of the target over B rows x n positions (after a context of 128 tokens).

    The fastest of `repeats` runs is kept (on a shared machine the others measure the neighbours),
    and the table is made non-decreasing in B and n: more work never costs less.
    """
    batches = sorted({b for b in (1, 2, 4, 8, 16, 32) if b < max_batch} | {max_batch})
    positions = sorted({n for n in (1, 2, 4, 8, 16, 32) if n < max_n} | {max(max_n, 2)})
    if len(positions) < 2:
        positions = [1, 2]
    prompt = [i % 200 + 10 for i in range(CALIBRATION_CONTEXT + 1)]
    solo = target.make_cache()
    target.prefill(prompt[:-1], solo)
    seconds = np.zeros((len(batches), len(positions)))
    for i, b in enumerate(batches):
        batch = RaggedBatch(len(solo))
        for _ in range(b):
            batch.add(solo)
        for j, n in enumerate(positions):
            ids = mx.array(np.full((b, n), 42, dtype=np.uint32))
            timings = []
            for _ in range(repeats + 1):  # the first run warms up
                t0 = time.perf_counter()
                out = target.model(ids, cache=batch.layers)
                mx.eval(out, [layer.state for layer in batch.layers])
                timings.append(time.perf_counter() - t0)
            seconds[i, j] = min(timings[1:])
    seconds = np.maximum.accumulate(np.maximum.accumulate(seconds, axis=0), axis=1)
    return CostTable(batches, positions, seconds)


class BatchBudget:
    def __init__(
        self,
        k: int,
        auto: bool = False,
        costs: CostTable | None = None,
        probe_every: int = 16,
        probe_k: int = 2,
        forget: float = 0.9,
        prior_alpha: float = 0.5,
    ):
        if auto and costs is None:
            raise ValueError("budget=auto needs a CostTable (calibrate)")
        self.k, self.auto, self.costs = k, auto, costs
        self.probe_every, self.probe_k, self.forget = probe_every, probe_k, forget
        # acceptance and draft availability as decayed counts, starting from a weak prior of 4 tokens / rows
        self._acc, self._drafted = 4 * prior_alpha, 4.0
        self._rows_with_draft, self._rows = 4.0, 4.0
        self._plain_steps = 0
        self._scale = {True: [1.0, 1.0], False: [1.0, 1.0]}  # n == 1 ? -> [sum measured/calibrated, weight]
        self.last_reason = "fixed"

    @property
    def alpha(self) -> float:
        return min(self._acc / self._drafted, 0.999)

    @property
    def rho(self) -> float:
        return self._rows_with_draft / self._rows

    def next_k(self, rows: int) -> int:
        if not self.auto:
            return self.k
        best = max(range(self.k + 1), key=lambda k: self.rate(rows, k))
        if best == 0:
            self._plain_steps += 1
            if self._plain_steps >= self.probe_every:
                self._plain_steps = 0
                self.last_reason = "probe"
                return min(self.probe_k, self.k)
            self.last_reason = "plain"
            return 0
        self._plain_steps = 0
        self.last_reason = "cost"
        return best

    def rate(self, rows: int, k: int) -> float:
        """Expected tokens per second of the batch with K = k (see the module docstring)."""
        a, rho = self.alpha, self.rho
        expected = rho * (1 - a ** (k + 1)) / (1 - a) + (1 - rho)
        return rows * expected / self.step_time(rows, 1 + k)

    def step_time(self, rows: int, n: int) -> float:
        """Calibrated T(rows, n) times what this run's steps of that kind measured against it."""
        total, weight = self._scale[n == 1]
        assert self.costs is not None, "auto prices steps only with a calibrated cost table"
        return self.costs.time(rows, n) * total / weight

    def observe(self, report) -> None:
        """Learn step cost, acceptance and draft availability from a step (K = 0 steps teach only cost)."""
        if self.costs is not None and report.verify_s > 0:
            ratio = report.verify_s / self.costs.time(report.batch, report.positions)
            scale = self._scale[report.positions == 1]
            scale[0], scale[1] = self.forget * scale[0] + ratio, self.forget * scale[1] + 1.0
        if report.positions == 1 and all(r.drafted == 0 for r in report.rows) and self.last_reason == "plain":
            return
        f = self.forget
        drafted = sum(r.drafted for r in report.rows)
        self._acc = f * self._acc + sum(r.accepted for r in report.rows)
        self._drafted = f * self._drafted + drafted
        self._rows_with_draft = f * self._rows_with_draft + sum(r.drafted > 0 for r in report.rows)
        self._rows = f * self._rows + len(report.rows)
