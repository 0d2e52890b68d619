"""How far a batch's rows draft this step: the width that gives the most tokens per second for the whole batch.

Contract: `BatchPricing(table).curve(rows)` is the curve each budget=auto row of a batch prices its draft by this
step (the row's `price`, handed to `Budget.plan(price=)`), or None for a batch of one (the row prices as if
alone). `rows` are (expected tokens per k, draft cost per token, share of asked steps on which the row's drafter
proposed anything) for each row whose budget prices its K (`Budget.expected_tokens`); the others are left out.

Every row of a batch waits for the widest row's forward, and padding columns are computed anyway: the step's
cost is T(B, 1 + K) for the widest draft K (batch/costs.py, measured), whichever rows fill it. So K is a decision
for the batch, as vLLM and SGLang make it for one speculative batch: the K that maximises

    rate(K) = sum_r [rho_r E_r(K) + 1 - rho_r] / (T(B, 1 + K) + T(1, 1) sum_r rho_r c_r K),

with E_r(K) = 1 + a_r (1 - g_r^K) / (1 - g_r) from the row's own rates, must beat plain decoding (K = 0, B tokens per
T(B, 1)) by MARGIN or the batch decodes plain: a mispriced step costs every row. Inside that width a row's drafts
cost the batch nothing more, so each row prices positions up to 1 + K at a plain step's price (its own draft cost
still counts) and none beyond: a row whose drafts do not hold drafts less. On a compute-bound batch (a CPU at 8
rows) K falls to 0 unless the rows' drafts nearly always hold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specpipe.batch.costs import CostTable
from specpipe.budgets.fixed import K_MAX

MARGIN = 0.03  # a K > 0 must beat plain decoding by this share: near-ties go to plain
BEYOND = 1e6  # the price of a position past the batch's width: never drafted


@dataclass(frozen=True)
class RowRates:
    """What one priced row expects from a draft of k tokens."""

    expected_tokens: Callable[[int], float]  # tokens a step drafting k yields (accepted drafts + the next token)
    c: float  # one drafted token's cost, in single-row target forwards T(1, 1)
    rho: float  # share of the row's asked steps on which its drafter proposed anything (n-gram: a match)


class BatchPricing:
    def __init__(self, table: CostTable, k_max: int = K_MAX):
        self.table, self.k_max = table, min(k_max, K_MAX)
        self.width = 0  # the last step's K: what the rows were allowed (for the server's steps.jsonl)

    def best_k(self, rows: Sequence[RowRates], batch: int) -> int:
        """The batch's K this step (0: plain for every priced row)."""
        if not rows:
            return 0
        t11 = self.table.time(1, 1)

        def rate(k: int) -> float:
            tokens = sum(r.rho * r.expected_tokens(k) + 1 - r.rho for r in rows) if k else float(len(rows))
            return tokens / (self.table.time(batch, 1 + k) + t11 * k * sum(r.rho * r.c for r in rows))

        best = max(range(self.k_max + 1), key=lambda k: (rate(k), -k))
        return best if best and rate(best) > rate(0) * (1 + MARGIN) else 0

    def curve(self, rows: Sequence[RowRates], batch: int) -> dict[int, float] | None:
        """The price of n positions for every priced row this step; None for a batch of one."""
        if batch <= 1:
            self.width = 0
            return None
        self.width = self.best_k(rows, batch)
        return {n: 1.0 if n <= 1 + self.width else BEYOND for n in range(1, K_MAX + 2)}
