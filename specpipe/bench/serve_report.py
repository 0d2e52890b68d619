"""The concurrency benchmark's report: specpipe-bench-serve's JSONL -> tables and plots.

Contract: `is_serve_record(r)` tells a bench_serve line (one per variant, concurrency and repeat)
from a specpipe-bench line; `summarize_levels(records)` pools the repeats of each (model,
variant, concurrency): medians of tok/s, TTFT and inter-token percentiles, the speed-up over the
baseline variant (the first of the file, `off` by default) as the median of per-repeat ratios
(each repeat ran its variants back to back), acceptance pooled, lossless only if every repeat
was. `render_serve` writes the markdown; plots.py draws speed-up vs concurrency and the
inter-token latency CDF per concurrency. Reads only the JSONL; never imports mlx.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path


def is_serve_record(record: dict) -> bool:
    return "clients" in record and "variant" in record and "tok_s" in record


def baseline_variant(records: list[dict]) -> str:
    """The file's first variant: bench_serve writes the baseline first in every level."""
    return records[0]["variant"]


def summarize_levels(records: list[dict]) -> list[dict]:
    """One dict per (model, variant, clients), sorted by model, variant order in the file, clients."""
    base = baseline_variant(records)
    order = list(dict.fromkeys(r["variant"] for r in records))
    by_level: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        by_level[(r.get("model", "?"), r["variant"], r["clients"])].append(r)
    out = []
    for (model, variant, clients), rs in by_level.items():
        base_rs = {r["repeat"]: r for r in by_level.get((model, base, clients), [])}
        ratios = [r["tok_s"] / base_rs[r["repeat"]]["tok_s"] for r in rs if r["repeat"] in base_rs]
        drafted = sum(r.get("drafted", 0) for r in rs)
        out.append(
            {
                "model": model,
                "variant": variant,
                "clients": clients,
                "repeats": len(rs),
                "tok_s": statistics.median(r["tok_s"] for r in rs),
                "speedup": statistics.median(ratios) if ratios else None,
                "speedup_min": min(ratios) if ratios else None,
                "ttft_p50_s": _median(r.get("ttft_p50_s") for r in rs),
                "itl_p50_s": _median(r.get("itl_p50_s") for r in rs),
                "itl_p95_s": _median(r.get("itl_p95_s") for r in rs),
                "itl_p99_s": _median(r.get("itl_p99_s") for r in rs),
                "acceptance": (
                    sum(r.get("accepted", 0) for r in rs) / drafted
                    if drafted
                    else statistics.mean(r.get("acceptance", 0.0) for r in rs)
                ),
                "lossless": all(r.get("lossless", False) for r in rs),
                "gaps_s": [g for r in rs for g in r.get("gaps_s", [])],
                "base": base,
            }
        )
    return sorted(out, key=lambda s: (s["model"], order.index(s["variant"]), s["clients"]))


def _median(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def render_serve(levels: list[dict], plots: list[str], sources: list[Path]) -> str:
    base = levels[0]["base"] if levels else "off"
    parts = [
        "# specpipe concurrency benchmark report",
        "",
        f"Sources: {', '.join(str(s) for s in sources)}. Speed-up: aggregate tok/s over `{base}` in the same repeat",
        "(median of repeats; min in brackets). ITL: gap between streamed chunks (one chunk per step).",
        "",
        "| model | variant | clients | tok/s | vs " + base + " | TTFT p50 | ITL p50 | ITL p95 | ITL p99 | "
        "acceptance | lossless |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in levels:
        speedup = "-" if s["speedup"] is None else f"{s['speedup']:.2f}x ({s['speedup_min']:.2f})"
        parts.append(
            f"| {s['model']} | {s['variant']} | {s['clients']} | {s['tok_s']:.1f} | {speedup} | "
            f"{_ms(s['ttft_p50_s'])} | {_ms(s['itl_p50_s'])} | {_ms(s['itl_p95_s'])} | {_ms(s['itl_p99_s'])} | "
            f"{s['acceptance']:.2f} | {'yes' if s['lossless'] else 'NO'} |"
        )
    parts += ["", *[f"![{Path(p).stem}]({Path(p).name})" for p in plots]]
    return "\n".join(parts) + "\n"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
