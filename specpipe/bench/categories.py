"""The bench report's per-category figures (a Spec-Bench suite: each record's `category`).

Contract: `category_section(groups)` returns markdown lines, one table per configuration with
categories: per category the end-to-end speed-up over plain (prefill included; geometric mean of the
per-prompt ratios) and its worst prompt, the decode speed-up beside it, mean accepted tokens per step
(tokens / target forwards, bonus included, as Spec-Bench's "mean accepted tokens"), time to first token
against plain's (the worst prompt), each fixed K's end-to-end speed-up beside the budget's (fixed_ks),
and Spec-Bench's speed() statistic (answer_files.py) so the answer files' figure can be held against the
report's. Empty when no record has a category.
"""

from __future__ import annotations

import math

from specpipe.bench.answer_files import spec_bench_speedup
from specpipe.bench.noise import passed


def _geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else 0.0


def _ttft_ratio(r: dict) -> float:
    base = r["baseline"]["ttft_s"]
    return r["spec"]["ttft_s"] / base if base else 0.0


def _fixed_e2e(r: dict, k: int) -> float:
    """The fixed-K run's end-to-end speed-up over the record's plain run (0: K not measured for it)."""
    run = (r.get("fixed") or {}).get(str(k))
    base = r["baseline"]["e2e_tok_s"]
    return run["e2e_tok_s"] / base if run and base else 0.0


def category_rows(rs: list[dict]) -> list[list]:
    """One row per category (file order), then "all"."""
    by: dict[str, list[dict]] = {}
    for r in rs:
        if r.get("category"):
            by.setdefault(r["category"], []).append(r)
    if not by:
        return []
    ks = sorted({int(k) for r in rs for k in (r.get("fixed") or {})})
    rows = []
    for name, group in [*by.items(), ("all", [r for g in by.values() for r in g])]:
        spec = [r["spec"] for r in group]
        fixed = {k: _geomean([_fixed_e2e(r, k) for r in group]) for k in ks}  # end to end, as the budget's
        best = max(fixed, key=lambda k: fixed[k]) if fixed else None
        clean = passed(group)  # the noise guards' excluded prompts left out
        speedup = _geomean([r["speedup_e2e"] for r in clean])
        outside = spec_bench_speedup(group)
        rows.append(
            [
                name,
                len(group),
                f"**{speedup:.2f}x**",
                f"{min(r['speedup_e2e'] for r in group):.2f}x",
                f"{_geomean([r['speedup'] for r in clean]):.2f}x",
                f"{outside:.3f}x" if outside else "-",
                f"{sum(s['generated_tokens'] for s in spec) / max(1, sum(s['steps'] for s in spec)):.2f}",
                f"{sum(r['baseline']['ttft_s'] for r in group) / len(group):.2f} / "
                f"{sum(s['ttft_s'] for s in spec) / len(group):.2f}",
                f"{max(_ttft_ratio(r) for r in group):.2f}",
                *[f"{fixed[k]:.2f}x" for k in ks],
            ]
            # the header has this column only when fixed Ks were measured
            + ([f"{speedup / fixed[best]:.2f} (K={best})" if best is not None and fixed[best] else "-"] if ks else [])
        )
    return rows


def category_section(groups: dict[str, list[dict]], config_name) -> list[str]:
    """Markdown for every configuration whose records carry a category (Spec-Bench)."""
    parts: list[str] = []
    for rs in groups.values():
        rows = category_rows(rs)
        if not rows:
            continue
        ks = sorted({int(k) for r in rs for k in (r.get("fixed") or {})})
        if not parts:
            parts += [
                "",
                "## Per category (Spec-Bench)",
                "",
                "End-to-end speed-up over plain decoding (tokens over the whole request's wall time, prefill "
                "included; geometric mean over the category's questions; worst question beside it), decode "
                "speed-up (decode tok/s) beside it; Spec-Bench's own speed() statistic beside them: mean tokens/s "
                "including prefill over the category's questions, over plain's, as its evaluation/speed.py computes "
                "from the answer files in spec_bench/), mean accepted tokens per step (tokens per target forward, "
                "bonus included), time to first token plain / budget (mean seconds) and the worst question's budget / "
                "plain TTFT.",
            ]
        header = [
            "category",
            "questions",
            "end-to-end speed-up",
            "worst",
            "decode speed-up",
            "Spec-Bench speed()",
            "tokens/step",
            "TTFT s plain / spec",
            "worst TTFT ratio",
        ]
        header += [f"K={k}" for k in ks] + (["budget / best fixed K"] if ks else [])
        parts += ["", f"**{config_name(rs[0]['label'])}**", "", _table(header, rows)]
    return parts


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
