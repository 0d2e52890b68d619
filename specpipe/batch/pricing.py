"""What a batched row's draft costs the batch: the curve each row's budget prices its K with (`price_batch`).

Contract: `BatchPricing(table).curve(rows, drafting)` is {n: cost of this row feeding n positions, in this row's
plain steps}, from the measured T(B, n) (batch/costs.py). Every row of a batch pays for the widest row's
forward: when one row drafts k tokens and the others none, the step costs T(B, k + 1) where plain decoding
costs T(B, 1), and every row waits for it. Plain decoding gives B tokens per T(B, 1); the drafting row's k
drafts pay when its expected extra tokens beat what the whole batch loses, E(k) - 1 > B (T(B, k + 1) / T(B, 1) - 1).
So the row prices n positions at 1 + B (T(B, n) / T(B, 1) - 1), the loss shared among the rows that draft
(`drafting`, from the previous step: when all B draft, each pays its own T(B, n) / T(B, 1)). At B = 1 this is
the row's own curve; on a compute-bound batch (a CPU at 8 rows) every row's K falls to 0 unless its
drafts nearly always hold.
"""

from __future__ import annotations

from specpipe.batch.costs import CostTable
from specpipe.budgets.fixed import K_MAX


class BatchPricing:
    def __init__(self, table: CostTable):
        self.table = table
        self._curves: dict[tuple[int, int], dict[int, float]] = {}

    def curve(self, rows: int, drafting: int) -> dict[int, float]:
        """{n: plain steps of this row that feeding n positions costs}, n = 1..K_MAX + 1, for a batch of `rows`
        of which `drafting` (at least 1) draft."""
        key = (rows, max(1, min(drafting, rows)))
        if key not in self._curves:
            plain = self.table.time(rows, 1)
            share = rows / key[1]
            self._curves[key] = {
                n: 1.0 + share * max(0.0, self.table.time(rows, n) / plain - 1.0) for n in range(1, K_MAX + 2)
            }
        return self._curves[key]
