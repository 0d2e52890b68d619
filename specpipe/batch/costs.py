"""What one target forward over B rows x n positions costs on this machine, T(B, n), cached.

Contract: `cost_table(target, max_batch, max_n)` returns a `CostTable` of real forward timings,
read from `<specpipe cache>/calibration/` when this target, precision, device and BLAS were
timed before (the key of the single-row curve in specpipe/costmodel/calibration.py, plus the
table's bounds), else timed now and saved. Timing is a server start-up step, never a
constructor's side effect. batch/pricing.py turns it into the price of a batched row's draft, which every
budget=auto row plans its K by (specpipe-serve times it at start).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from specpipe.batch.cache import RaggedBatch
from specpipe.engine.engine import Capture

CALIBRATION_CONTEXT = 128  # tokens of context per row while timing
FORMAT = "batch-v2"  # bump when what is timed changes: an old file then misses instead of misleading


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

    def to_json(self) -> dict:
        return {"batches": self.batches, "positions": self.positions, "seconds": self.seconds.tolist()}

    @classmethod
    def from_json(cls, data: dict) -> CostTable:
        return cls(list(data["batches"]), list(data["positions"]), np.asarray(data["seconds"], dtype=float))


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
                # a hybrid's served forward records each position's recurrent state (its mixers loop per token)
                capture = Capture(states=batch.state_capture()) if batch.wants_states else None
                out = target.forward(
                    ids, batch.layers, capture=capture, positions=batch.positions(n), mask=batch.mask(n)
                ).logits
                mx.eval(out, [layer.state for layer in batch.layers])
                timings.append(time.perf_counter() - t0)
            seconds[i, j] = min(timings[1:])
    seconds = np.maximum.accumulate(np.maximum.accumulate(seconds, axis=0), axis=1)
    return CostTable(batches, positions, seconds)


def cost_table(target, max_batch: int, max_n: int, refresh: bool = False, repeats: int = 5) -> tuple[CostTable, str]:
    """The cached T(B, n) table for this target and device, timing it on first use.

    Returns:
        (table, where): `where` says "cached <path>" or "timed now, saved to <path>" for the start-up line.
    """
    from specpipe.costmodel.calibration import calibration_key
    from specpipe.engine.load.model_store import cache_dir

    name = f"{FORMAT}-{calibration_key(target)}-B{max_batch}-n{max_n}-ctx{CALIBRATION_CONTEXT}.json"
    path = cache_dir() / "calibration" / name
    if path.exists() and not refresh:
        try:
            return CostTable.from_json(json.loads(path.read_text())), f"cached {path}"
        except (ValueError, KeyError):
            pass  # a torn or foreign file: time again and overwrite it
    table = calibrate(target, max_batch, max_n, repeats=repeats)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table.to_json()))
    tmp.replace(path)  # atomic: a concurrent server start reads the old file or the new one, never half
    return table, f"timed now, saved to {path}"
