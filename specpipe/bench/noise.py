"""Noise guards for one prompt's bench record: figures that one noisy timing made, found before they reach a headline.

Contract: `suspect(record)` names what cannot be right in a record, or None: a speed-up above its run's tokens per
forward by more than NOISE (a step that verifies K + 1 positions is never cheaper than a plain one, so only a slow
plain run gives that), or a plain run more than OUTLIER off its own repeats or mlx-lm's plain decoding of the same
prompt. The harness measures a suspect prompt once more and keeps `record["noise"]` ({"first": why, "flag": why it
is still suspect or None}); `passed(records)` are those the headlines pool. Nothing here times anything.
"""

from __future__ import annotations

import statistics

NOISE = 0.10  # a speed-up up to 10% above tokens per forward is timing noise; past it, a plain run was slow
OUTLIER = 1.5  # a plain run 1.5x off its repeats' median or mlx-lm's plain on the same prompt


def suspect(record: dict) -> str | None:
    """Why this record's figures cannot be trusted, or None.

    Example: plain 2.8 tok/s against repeats and mlx-lm's ~12, speed-up 10.26x at 2.24 tokens per forward ->
    "speed-up 10.26x above its 2.24 tokens per forward".
    """
    runs = [("budget", record["spec"], record["speedup"])]
    runs += [(f"K={k}", run, run.get("speedup", 0.0)) for k, run in (record.get("fixed") or {}).items()]
    for name, run, speedup in runs:
        tpf = run.get("tokens_per_forward") or 0.0
        if tpf and speedup > tpf * (1 + NOISE):
            return f"{name} speed-up {speedup:.2f}x above its {tpf:.2f} tokens per forward"
    plain = record["baseline"]
    repeats = plain.get("decode_tok_s_runs") or []
    if len(repeats) > 1:
        middle = statistics.median(repeats)
        worst = min(repeats)
        if worst and middle / worst > OUTLIER:
            return f"a plain repeat at {worst:.1f} tok/s against their median {middle:.1f}"
    anchor = (record.get("anchor") or {}).get("plain")
    if anchor and anchor.get("decode_tok_s") and plain["decode_tok_s"]:
        ratio = plain["decode_tok_s"] / anchor["decode_tok_s"]
        if not 1 / OUTLIER <= ratio <= OUTLIER:
            return f"plain {plain['decode_tok_s']:.1f} tok/s against mlx-lm's plain {anchor['decode_tok_s']:.1f}"
    return None


def flagged(record: dict) -> str | None:
    """Why a record stayed suspect after its re-measure (None: it passed)."""
    return (record.get("noise") or {}).get("flag")


def passed(records: list[dict]) -> list[dict]:
    """The records a headline pools: every one that did not stay suspect (all of them when none passed)."""
    kept = [r for r in records if not flagged(r)]
    return kept or records
