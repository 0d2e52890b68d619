"""PNG plots of summarized benchmark configurations (matplotlib, Agg backend).

Contract: `draw_all(summaries, out_dir)` takes report.summarize()
outputs and writes speed-up vs K per suite, acceptance by draft position,
the inter-token latency CDF and peak memory vs K; it returns the file paths.
Never imports mlx.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

MAX_LINES = 12  # more lines than this make a legend unreadable


def draw_all(summaries: list[dict], out_dir: str | Path) -> list[str]:
    out_dir = Path(out_dir)
    return [
        speedup_vs_k(summaries, out_dir / "speedup_vs_k.png"),
        acceptance_by_position(summaries, out_dir / "acceptance_by_position.png"),
        latency_cdf(summaries, out_dir / "latency_cdf.png"),
        memory_vs_k(summaries, out_dir / "memory_vs_k.png"),
    ]


def series_name(label: dict) -> str:
    """A line = everything but K: suite, model and drafter."""
    draft = label["drafter"] if label["drafter"] != "model" else f"draft {label.get('draft_model')}"
    budget = label.get("budget", "fixed").split("(")[0]
    return f"{label['suite']}: {label['model']} + {draft}" + ("" if budget == "fixed" else f" [{budget}]")


def by_series(summaries: list[dict]) -> dict[str, list[dict]]:
    series: dict[str, list[dict]] = defaultdict(list)
    for s in summaries:
        series[series_name(s["label"])].append(s)
    return {name: sorted(ss, key=lambda s: s["label"]["k"]) for name, ss in sorted(series.items())}


def speedup_vs_k(summaries: list[dict], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, ss in by_series(summaries).items():
        ks = [s["label"]["k"] for s in ss]
        (line,) = ax.plot(ks, [s["speedup"] for s in ss], marker="o", label=f"{name} (specpipe)")
        anchored = [s for s in ss if s["anchor"] and s["anchor"]["speedup"]]
        if anchored:
            ax.plot(
                [s["label"]["k"] for s in anchored],
                [s["anchor"]["speedup"] for s in anchored],
                marker="x",
                linestyle=":",
                color=line.get_color(),
                label=f"{name} (mlx-lm)",
            )
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    _k_axis(ax, summaries)
    ax.set_xlabel("budget K (draft tokens per step)")
    ax.set_ylabel("speed-up vs plain decoding (decode tok/s)")
    ax.set_title("Speed-up vs K (below the dashed line, speculation loses)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def acceptance_by_position(summaries: list[dict], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in [s for s in summaries if s["by_position"]][:MAX_LINES]:
        rates = s["by_position"]
        ax.plot(range(1, len(rates) + 1), rates, marker=".", label=f"{series_name(s['label'])} k={s['label']['k']}")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate at that position")
    ax.set_title("Acceptance by draft position")
    ax.legend(fontsize=7)
    return _save(fig, path)


def latency_cdf(summaries: list[dict], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    # Every configuration ran its own baseline: pool them per (suite, model) into one dashed line.
    baselines: dict[tuple, list[float]] = defaultdict(list)
    for s in summaries:
        baselines[(s["label"]["suite"], s["label"]["model"])].extend(s["base_gaps"])
    for (suite, model), gaps in sorted(baselines.items()):
        _cdf(ax, gaps, f"{suite}: {model} plain", linestyle="--")
    for s in summaries[:MAX_LINES]:
        if s["gaps"]:
            _cdf(ax, s["gaps"], f"{series_name(s['label'])} k={s['label']['k']}")
    ax.set_xscale("log")
    ax.set_xlabel("inter-token latency (ms, log scale)")
    ax.set_ylabel("fraction of tokens")
    ax.set_title("Inter-token latency CDF (dashed: plain decoding)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def memory_vs_k(summaries: list[dict], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, ss in by_series(summaries).items():
        (line,) = ax.plot([s["label"]["k"] for s in ss], [s["peak_mib"] for s in ss], marker="o", label=name)
        ax.axhline(max(s["base_peak_mib"] for s in ss), color=line.get_color(), linestyle="--", linewidth=1)
    _k_axis(ax, summaries)
    ax.set_xlabel("budget K")
    ax.set_ylabel("peak MLX memory during the run (MiB)")
    ax.set_title("Peak memory vs K (dashed: plain decoding)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def _k_axis(ax, summaries: list[dict]) -> None:
    """log2 spacing, but label the budgets themselves (4, 8, 16), not 2^2."""
    ks = sorted({s["label"]["k"] for s in summaries if s["label"]["k"]})
    ax.set_xscale("log", base=2)
    if ks:
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()


def _cdf(ax, values: list[float], label: str, **style) -> None:
    ordered = sorted(v for v in values if v > 0)
    if ordered:
        n = len(ordered)
        ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=label, **style)


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


# ---------------------------------------------------------------- concurrency (specpipe-bench-serve)


def draw_concurrency(levels: list[dict], out_dir: str | Path) -> list[str]:
    """serve_report.summarize_levels() -> speed-up vs concurrency and the ITL CDF per concurrency."""
    out_dir = Path(out_dir)
    return [
        speedup_vs_concurrency(levels, out_dir / "speedup_vs_concurrency.png"),
        itl_cdf_by_concurrency(levels, out_dir / "itl_cdf_by_concurrency.png"),
    ]


def speedup_vs_concurrency(levels: list[dict], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lines: dict[str, list[dict]] = defaultdict(list)
    for s in levels:
        if s["variant"] != s["base"] and s["speedup"] is not None:
            lines[f"{s['model']}: {s['variant']}"].append(s)
    for name, ss in sorted(lines.items()):
        ax.plot([s["clients"] for s in ss], [s["speedup"] for s in ss], marker="o", label=name)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.axhline(0.97, color="red", linestyle=":", linewidth=1, label="0.97x (auto's floor)")
    clients = sorted({s["clients"] for s in levels})
    ax.set_xscale("log", base=2)
    ax.set_xticks(clients, [str(c) for c in clients])
    ax.minorticks_off()
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel(f"aggregate tok/s over {levels[0]['base'] if levels else 'off'}")
    ax.set_title("Speculation under concurrency (dashed: plain decoding)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def itl_cdf_by_concurrency(levels: list[dict], path: Path) -> str:
    """One panel per concurrency, one line per variant (the baseline dashed)."""
    clients = sorted({s["clients"] for s in levels})
    fig, axes = plt.subplots(1, max(len(clients), 1), figsize=(3.2 * max(len(clients), 1), 3.8), sharey=True)
    axes = list(axes) if len(clients) > 1 else [axes]
    for ax, c in zip(axes, clients):
        for s in [s for s in levels if s["clients"] == c][:MAX_LINES]:
            style = {"linestyle": "--"} if s["variant"] == s["base"] else {}
            _cdf(ax, [g * 1000 for g in s["gaps_s"]], f"{s['model']}: {s['variant']}", **style)
        ax.set_xscale("log")
        ax.set_title(f"{c} client{'s' if c > 1 else ''}")
        ax.set_xlabel("inter-token latency (ms)")
    axes[0].set_ylabel("fraction of chunks")
    axes[-1].legend(fontsize=7)
    return _save(fig, path)
