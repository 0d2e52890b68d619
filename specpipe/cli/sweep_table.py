"""The one table a sweep (`specpipe -m budget.k=4,8`) ends with: a row per job, its config and its figures.

Contract: `record(overrides, result)` is called by each job of a multirun as it finishes (same process: Hydra's
basic launcher); `table()` renders the rows recorded so far (empty when fewer than one), naming each job by the
overrides that differ between jobs. A launcher that runs jobs in other processes (joblib) records nothing
here; each job's summary.json holds the same figures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    overrides: tuple[str, ...]  # the job's command-line overrides, as Hydra lists them
    tokens_per_forward: float
    acceptance: float  # accepted / drafted (0 when nothing was drafted)
    drafted: int
    tok_s: float
    estimate: float  # the cost model's speed-up against plain decoding; 0: no estimate
    output_dir: str


_rows: list[Row] = []


def record(overrides: list[str], result) -> None:
    s = result.stats
    _rows.append(
        Row(
            tuple(overrides),
            s.tokens_per_forward,
            s.acceptance_rate,
            s.drafted,
            s.decode_tok_s,
            float(getattr(result, "speedup_estimate", 0.0) or 0.0),
            str(result.output_dir),
        )
    )


def rows() -> list[Row]:
    return list(_rows)


def table(recorded: list[Row] | None = None) -> str:
    """The sweep's jobs as one aligned table ("" for no rows). Example, for `-m budget.k=4,8`:

    config      tok/forward  acceptance  tok/s  estimate
    budget.k=4  2.31         66%         21.4   ~1.4x
    budget.k=8  2.52         41%         19.0   ~1.2x
    """
    recorded = rows() if recorded is None else recorded
    if not recorded:
        return ""
    common = set(recorded[0].overrides).intersection(*(r.overrides for r in recorded[1:]))
    lines = [("config", "tok/forward", "acceptance", "tok/s", "estimate")]
    for r in recorded:
        name = " ".join(o for o in r.overrides if o not in common) or "(defaults)"
        acceptance = f"{r.acceptance:.0%}" if r.drafted else "-"  # draft=none drafts nothing: no rate
        estimate = f"~{r.estimate:.1f}x" if r.estimate > 0 else "-"
        lines.append((name, f"{r.tokens_per_forward:.2f}", acceptance, f"{r.tok_s:.1f}", estimate))
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    folder = recorded[0].output_dir.rsplit("/", 1)[0]
    shared = f" (every job: {' '.join(sorted(common))})" if common else ""
    return "\n".join([f"sweep of {len(recorded)} jobs{shared}, in {folder}/<job>", *out])
