"""`specpipe-bench-report DIR`: the results JSONL of a run or sweep folder ->
`DIR/report.md` with summary tables, per-prompt tables, token-match flags and
PNG plots (plots.py).

Contract: reads only the JSONL (every `bench.jsonl` under DIR, or DIR itself
when it is a file); never imports mlx. Aggregates are pooled over prompts:
rates from summed counts, speed-up as the geometric mean of per-prompt ratios. The
headline is end to end (generated tokens over the whole request's wall time, prefill
included: what a user waits for); decode speed-up stands beside it. Verdicts and the
best K choose on end to end.
A JSONL of specpipe-bench-serve (concurrency levels) gets its own report
(serve_report.py): speed-up vs concurrency and the latency CDF per concurrency.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

from specpipe.bench.categories import category_section
from specpipe.bench.noise import flagged, passed
from specpipe.bench.records import read_records
from specpipe.bench.serve_report import is_serve_record

# ---------------------------------------------------------------- aggregation


def find_results(target: Path) -> list[Path]:
    """A file as given (bench.jsonl, or specpipe-bench-serve's JSONL), else every bench.jsonl under a folder."""
    if target.is_file():
        return [target]
    return sorted(target.rglob("bench.jsonl"))


def group_by_config(records: list[dict]) -> dict[str, list[dict]]:
    """config hash -> records, one per prompt id (a later line for the same pair wins)."""
    pairs = {(r["config_hash"], r["prompt_id"]): r for r in records}
    groups: dict[str, list[dict]] = defaultdict(list)
    for (chash, _), r in pairs.items():
        groups[chash].append(r)
    return dict(sorted(groups.items(), key=lambda kv: sort_key(kv[1][0]["label"])))


def sort_key(label: dict) -> tuple:
    return (label["suite"], label["model"], label["drafter"], str(label.get("draft_model")), label.get("k") or 0)


def e2e_ratio(run: dict | None, plain: dict | None) -> float | None:
    """End-to-end speed-up of `run` over `plain` (e2e tok/s: tokens over the whole request's wall time)."""
    if not run or not plain or not plain.get("e2e_tok_s"):
        return None
    return run["e2e_tok_s"] / plain["e2e_tok_s"]


def geomean(values: list[float]) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else 0.0


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest rank, as metrics.percentiles_ms."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def summarize(rs: list[dict]) -> dict:
    """Pooled figures of one configuration over its prompts."""
    spec = [r["spec"] for r in rs]
    base = [r["baseline"] for r in rs]
    gaps = [g for s in spec for g in s["gaps_ms"]]
    clean = passed(rs)  # the speed-up headlines pool only prompts whose timings passed the noise guards
    drafted_at, accepted_at = pooled_positions(spec)
    out = {
        "label": rs[0]["label"],
        "config": rs[0]["config"],
        "prompts": len(rs),
        "base_tok_s": mean([b["decode_tok_s"] for b in base]),
        "spec_tok_s": mean([s["decode_tok_s"] for s in spec]),
        "speedup": geomean([r["speedup"] for r in clean]),
        "speedup_min": min(r["speedup"] for r in clean),
        "speedup_max": max(r["speedup"] for r in clean),
        "speedup_e2e": geomean([r["speedup_e2e"] for r in clean]),
        "speedup_e2e_min": min(r["speedup_e2e"] for r in clean),
        "speedup_e2e_max": max(r["speedup_e2e"] for r in clean),
        "excluded": len(rs) - len(clean),
        "acceptance": _div(sum(s["accepted"] for s in spec), sum(s["drafted"] for s in spec)),
        "tokens_per_forward": _div(sum(s["generated_tokens"] for s in spec), sum(s["steps"] for s in spec)),
        "ttft_s": mean([s["ttft_s"] for s in spec]),
        "base_ttft_s": mean([b["ttft_s"] for b in base]),
        "ttft_worst": max((s["ttft_s"] / b["ttft_s"] for s, b in zip(spec, base) if b["ttft_s"]), default=0.0),
        "prefill_tok_s": mean([s["prefill_tok_s"] for s in spec]),
        "p50": percentile(gaps, 0.5),
        "p95": percentile(gaps, 0.95),
        "p99": percentile(gaps, 0.99),
        "peak_mib": max(s["peak_memory_bytes"] for s in spec) / 2**20,
        "base_peak_mib": max(b["peak_memory_bytes"] for b in base) / 2**20,
        "mismatches": sum(not r["tokens_match"] for r in rs),
        "by_position": [_div(a, d) for a, d in zip(accepted_at, drafted_at)],
        "gaps": gaps,
        "base_gaps": [g for b in base for g in b["gaps_ms"]],
        "anchor": None,
        "fixed": _fixed_sweep(rs),
    }
    anchored = [r["anchor"] for r in rs if r.get("anchor")]
    if anchored:
        specs = [a["spec"] for a in anchored if a["spec"]]
        out["anchor"] = {
            "plain_tok_s": mean([a["plain"]["decode_tok_s"] for a in anchored]),
            "spec_tok_s": mean([s["decode_tok_s"] for s in specs]) if specs else None,
            "speedup": geomean([a["speedup"] for a in anchored if a["speedup"]]) if specs else None,
            "speedup_e2e": geomean([e2e_ratio(a["spec"], a["plain"]) or 0.0 for a in anchored]) if specs else None,
            "plain_e2e": mean([a["plain"]["e2e_tok_s"] for a in anchored]),
            "ours_base_e2e": mean([r["baseline"]["e2e_tok_s"] for r in rs if r.get("anchor")]),
            "ours_spec_e2e": mean([r["spec"]["e2e_tok_s"] for r in rs if r.get("anchor")]),
            "spec_e2e": mean([s["e2e_tok_s"] for s in specs]) if specs else None,
            "differs": sum(
                run is not None and run.get("first_mismatch") is not None
                for a in anchored
                for run in (a["plain"], a["spec"])
            ),
            "sweep": _anchor_sweep(anchored),
        }
    return out


def _fixed_sweep(rs: list[dict]) -> dict | None:
    """specpipe's fixed-K runs beside the budget (fixed_ks), pooled over prompts: per K geomean speed-up, the best K."""
    swept = [r["fixed"] for r in rs if r.get("fixed")]
    if not swept:
        return None
    ks = sorted({int(k) for sw in swept for k in sw})
    base = [r["baseline"] for r in rs if r.get("fixed")]
    per_k = {
        k: {
            "speedup": geomean([sw[str(k)]["speedup"] for sw in swept if str(k) in sw]),
            "speedup_e2e": geomean([e2e_ratio(sw.get(str(k)), b) or 0.0 for sw, b in zip(swept, base)]),
        }
        for k in ks
    }
    return best_of(per_k)


def verdicts(records: list[dict]) -> list[str]:
    """One line per (suite, configuration): the budget vs specpipe's best fixed K vs mlx-lm's best K, same run,
    end to end (prefill included), the decode speed-up beside it."""
    lines = []
    for rs in group_by_config(records).values():
        lab = rs[0]["label"]
        clean = passed(rs)
        ours = geomean([r["speedup_e2e"] for r in clean])
        decode = geomean([r["speedup"] for r in clean])
        out = f", {len(rs) - len(clean)} excluded as noise" if len(clean) < len(rs) else ""
        parts = [
            f"verdict {lab['suite']} ({len(rs)} prompts{out}, {config_name(lab)}): {lab.get('budget', '?')} "
            f"{ours:.2f}x end to end (decode {decode:.2f}x)"
        ]
        fixed = _fixed_sweep(rs)
        if fixed:
            parts.append(
                f"best fixed K={fixed['best_k']} {fixed['best_e2e']:.2f}x -> {ours / fixed['best_e2e']:.2f} of it"
            )
        mlx = _anchor_sweep([r["anchor"] for r in rs if r.get("anchor")])
        anchored = [r["anchor"] for r in rs if r.get("anchor") and r["anchor"].get("speedup")]
        if mlx:
            parts.append(f"mlx-lm best K={mlx['best_k']} {mlx['best_e2e']:.2f}x -> {ours / mlx['best_e2e']:.2f} of it")
        elif anchored:
            mlx_spec = geomean([e2e_ratio(a["spec"], a["plain"]) or 0.0 for a in anchored])
            mlx_k = anchored[0]["spec"].get("num_draft_tokens", lab.get("k"))
            parts.append(f"mlx-lm K={mlx_k} {mlx_spec:.2f}x -> {ours / mlx_spec:.2f} of it")
        parts.append(winner(lab, ours, fixed))
        lines.append(" | ".join(parts))
    return lines


def tune_pays_at() -> float:
    """The speed-up below which speculation "does not pay": conf/tune.yaml's `pays_at`, that number's one home,
    so this report and specpipe-tune call the same results a win (two plain runs differ by ~5% here)."""
    import yaml  # plain data: safe_load runs nothing the file names

    conf = Path(__file__).resolve().parents[1] / "conf" / "tune.yaml"
    return float(yaml.safe_load(conf.read_text())["pays_at"])


def winner(label: dict, ours: float, fixed: dict | None, pays_at: float | None = None) -> str:
    """The setting to use for this suite, in words: the faster of the budget and the best fixed K, or plain
    decoding when neither beats it by `pays_at` (None: conf/tune.yaml's, `tune_pays_at`).

    Both figures end to end. Example: auto 1.92x, best fixed K=8 2.06x -> "use budget.k=8 (2.06x over plain)".
    """
    pays_at = tune_pays_at() if pays_at is None else pays_at
    budget = str(label.get("budget", "?"))  # "auto(k_max=16)", "fixed(k=8)"
    kind, _, args = budget.partition("(")
    best_name = f"budget.k={args.removeprefix('k=').rstrip(')')}" if kind == "fixed" else f"budget={kind}"
    best = ours
    if fixed and fixed["best_e2e"] > ours:
        best_name, best = f"budget.k={fixed['best_k']}", fixed["best_e2e"]
    if best < pays_at:
        return f"speculation does not pay here ({best:.2f}x at best): keep budget=auto, which falls back to plain"
    return f"use {best_name} ({best:.2f}x over plain)"


def _anchor_sweep(anchored: list[dict]) -> dict | None:
    """mlx-lm's num_draft_tokens sweep pooled over prompts: per K mean tok/s and geomean speed-up, and the best K."""
    with_sweep = [a for a in anchored if a.get("sweep")]
    swept = [a["sweep"] for a in with_sweep]
    if not swept:
        return None
    ks = sorted({int(k) for sw in swept for k in sw})
    per_k = {
        k: {
            "tok_s": mean([sw[str(k)]["decode_tok_s"] for sw in swept if str(k) in sw]),
            "speedup": geomean([sw[str(k)]["speedup"] for sw in swept if str(k) in sw]),
            "speedup_e2e": geomean([e2e_ratio(a["sweep"].get(str(k)), a["plain"]) or 0.0 for a in with_sweep]),
        }
        for k in ks
    }
    return best_of(per_k)


def pooled_positions(runs: list[dict]) -> tuple[list[int], list[int]]:
    drafted: list[int] = []
    accepted: list[int] = []
    for run in runs:
        for i, (d, a) in enumerate(zip(run.get("drafted_at", []), run.get("accepted_at", []))):
            if i == len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[i] += d
            accepted[i] += a
    return drafted, accepted


def _div(a: float, b: float) -> float:
    return a / b if b else 0.0


# ---------------------------------------------------------------- markdown


def config_name(label: dict) -> str:
    draft = label["drafter"] if label["drafter"] != "model" else f"model:{label.get('draft_model')}"
    budget = label.get("budget", "fixed")
    if budget.split("(")[0] == "fixed":
        return f"{label['model']} + {draft} k={label['k']}"
    return f"{label['model']} + {draft} [{budget}]"


def _both(figures: dict, prefix: str = "") -> str:
    """ "1.02x (1.34x)": end to end, decode in brackets, from `speedup_e2e` / `speedup` (or `best_e2e` /
    `best_speedup` with prefix "best_"); "-" where not measured."""
    e2e = figures.get(f"{prefix}e2e" if prefix else "speedup_e2e")
    decode = figures.get(f"{prefix}speedup" if prefix else "speedup")
    if e2e is None or decode is None:
        return "-"
    return f"{e2e:.2f}x ({decode:.2f}x)"


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render(summaries: list[dict], groups: dict[str, list[dict]], plots: list[str], sources: list[Path]) -> str:
    first = next(iter(groups.values()))[0]
    cfg = first["config"]
    dev, ver = first.get("device", {}), first.get("versions", {})
    n_pairs = sum(len(rs) for rs in groups.values())
    mism = sum(s["mismatches"] for s in summaries)
    parts = [
        "# specpipe benchmark report",
        "",
        f"- machine: {dev.get('cpu', dev.get('machine', '?'))}, mlx device {dev.get('mlx_device', '?')}, "
        f"BLAS {dev.get('blas', '?')}"
        + (
            f" ({dev['blas_threads']} thread{'' if dev['blas_threads'] == '1' else 's'})"
            if dev.get("blas_threads")
            else ""
        ),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in ver.items()),
        f"- fixed per run: precision {first['label'].get('precision')}, max_tokens {cfg.get('max_tokens')}, batch 1, "
        f"sampling temperature {cfg['sampling']['temperature']}, seed {cfg['sampling']['seed']}, "
        f"warm-up {cfg.get('warmup')}",
        f"- {len(summaries)} configurations, {n_pairs} (config, prompt) pairs, from "
        + ", ".join(str(p) for p in sources),
        f"- BLAS threads: {dev.get('blas_threads', '?')}"
        + (f" ({dev['blas_threads_reduced']})" if dev.get("blas_threads_reduced") else "")
        + " (chosen at start from the processes running then; `blas.threads=` overrides)",
        "- tok/s is decode speed (RunStats.decode_tok_s; mlx-lm: tokens after the first "
        "over the time after the first); "
        "the headline is the end-to-end speed-up (tokens over the whole request's wall time, prefill of the target "
        "and of any draft model included: what a user waits for), decode speed-up beside it; "
        "a speed-up is the geometric mean of per-prompt spec/baseline ratios, each pair measured back to back, "
        "over the prompts whose timings passed the noise guards (bench/noise.py; each excluded one is flagged below).",
        "",
        "## Token match (greedy losslessness)",
        "",
        f"**{mism} mismatches**: every speculative output equals its baseline token for token."
        if not mism
        else f"**{mism} MISMATCHES** between speculative and baseline tokens: see the flagged rows below.",
        "",
        "## Summary",
        "",
        table(
            [
                "suite",
                "config",
                "prompts",
                "baseline tok/s",
                "spec tok/s",
                "end-to-end speed-up (min-max)",
                "decode speed-up (min-max)",
                "acceptance",
                "tok/forward",
                "TTFT s plain / spec (worst ratio)",
                "prefill tok/s",
                "p50/p95/p99 ms",
                "peak MiB",
                "mismatches",
            ],
            [
                [
                    s["label"]["suite"],
                    config_name(s["label"]),
                    s["prompts"],
                    f"{s['base_tok_s']:.2f}",
                    f"{s['spec_tok_s']:.2f}",
                    f"**{s['speedup_e2e']:.2f}x** ({s['speedup_e2e_min']:.2f}-{s['speedup_e2e_max']:.2f})"
                    + (f", {s['excluded']} excluded as noise" if s.get("excluded") else ""),
                    f"{s['speedup']:.2f}x ({s['speedup_min']:.2f}-{s['speedup_max']:.2f})",
                    f"{s['acceptance']:.0%}",
                    f"{s['tokens_per_forward']:.2f}",
                    f"{s['base_ttft_s']:.2f} / {s['ttft_s']:.2f} ({s['ttft_worst']:.2f})",
                    f"{s['prefill_tok_s']:.0f}",
                    f"{s['p50']:.0f}/{s['p95']:.0f}/{s['p99']:.0f}",
                    f"{s['peak_mib']:.0f}",
                    s["mismatches"] or "0",
                ]
                for s in summaries
            ],
        ),
    ]
    anchored = [s for s in summaries if s["anchor"]]
    if anchored:
        parts += [
            "",
            "## specpipe vs mlx-lm (same run, same model objects, same prompt ids)",
            "",
            "mlx-lm has no n-gram drafter: its speculative column is empty unless the drafter is a model (or `self`). "
            "End-to-end (e2e) tok/s = generated tokens / wall time including prefill, on one clock for both systems.",
            "",
            table(
                [
                    "suite",
                    "config",
                    "specpipe plain",
                    "specpipe spec",
                    "specpipe speed-up",
                    "mlx-lm plain",
                    "mlx-lm spec",
                    "mlx-lm speed-up",
                    "end-to-end speed-up: specpipe / mlx-lm",
                    "e2e tok/s: ours plain / spec, mlx-lm plain / spec",
                    "mlx-lm tokens differ",
                ],
                [
                    [
                        s["label"]["suite"],
                        config_name(s["label"]),
                        f"{s['base_tok_s']:.2f}",
                        f"{s['spec_tok_s']:.2f}",
                        f"{s['speedup']:.2f}x",
                        f"{s['anchor']['plain_tok_s']:.2f}",
                        _fmt(s["anchor"]["spec_tok_s"]),
                        _fmt(s["anchor"]["speedup"], "x"),
                        f"**{s['speedup_e2e']:.2f}x** / {_fmt(s['anchor']['speedup_e2e'], 'x')}",
                        f"{s['anchor']['ours_base_e2e']:.2f} / {s['anchor']['ours_spec_e2e']:.2f}, "
                        f"{s['anchor']['plain_e2e']:.2f} / {_fmt(s['anchor']['spec_e2e'])}",
                        s["anchor"]["differs"],
                    ]
                    for s in anchored
                ],
            ),
        ]
    swept = [s for s in anchored if s["anchor"]["sweep"]]
    if swept:
        ks = sorted({k for s in swept for k in s["anchor"]["sweep"]["per_k"]})
        parts += [
            "",
            "## mlx-lm's num_draft_tokens sweep (same run)",
            "",
            "End-to-end speed-up (decode speed-up in brackets) of mlx-lm's speculative decoding over mlx-lm's own "
            "plain decoding, geometric mean over prompts; the best K is chosen end to end over the whole suite (no "
            "per-prompt oracle).",
            "",
            table(
                [
                    "suite",
                    "config",
                    *[f"mlx-lm K={k}" for k in ks],
                    "mlx-lm best",
                    "specpipe speed-up",
                    "specpipe / mlx-lm best",
                    "decode: specpipe / mlx-lm best",
                ],
                [
                    [
                        s["label"]["suite"],
                        config_name(s["label"]),
                        *[_both(s["anchor"]["sweep"]["per_k"].get(k, {})) for k in ks],
                        f"{_both(s['anchor']['sweep'], 'best_')} (K={s['anchor']['sweep']['best_k']})",
                        _both(s),
                        f"**{s['speedup_e2e'] / s['anchor']['sweep']['best_e2e']:.2f}**",
                        f"{s['speedup'] / s['anchor']['sweep']['best_speedup']:.2f}",
                    ]
                    for s in swept
                ],
            ),
        ]
    fixed = [s for s in summaries if s["fixed"]]
    if fixed:
        ks = sorted({k for s in fixed for k in s["fixed"]["per_k"]})
        parts += [
            "",
            "## The budget vs specpipe's fixed K (same run, same baseline runs)",
            "",
            "End-to-end speed-up over plain (decode speed-up in brackets); the best fixed K is chosen end to end.",
            "",
            table(
                ["suite", "config", *[f"K={k}" for k in ks], "best fixed", "budget", "budget / best fixed"],
                [
                    [
                        s["label"]["suite"],
                        config_name(s["label"]),
                        *[_both(s["fixed"]["per_k"].get(k, {})) for k in ks],
                        f"{_both(s['fixed'], 'best_')} (K={s['fixed']['best_k']})",
                        _both(s),
                        f"**{s['speedup_e2e'] / s['fixed']['best_e2e']:.2f}**",
                    ]
                    for s in fixed
                ],
            ),
        ]
    parts += category_section(groups, config_name)
    parts += ["", "## Verdict", ""] + [f"- {line}" for line in verdicts([r for rs in groups.values() for r in rs])]
    parts += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    parts += ["", "## Per prompt", ""]
    rows = []
    for s, rs in zip(summaries, groups.values()):
        for r in sorted(rs, key=lambda r: r["prompt_id"]):
            flag = "ok" if r["tokens_match"] else f"**MISMATCH at {r['first_mismatch']}**"
            if flagged(r):  # measured twice, suspect both times: out of the headline
                flag += f"; **noise, excluded**: {flagged(r)}"
            elif r.get("noise"):
                flag += f"; measured again ({r['noise']['first']})"
            a = r.get("anchor") or {}
            runs = {
                "plain": a.get("plain"),
                "spec": a.get("spec"),
                **{f"K={k}": v for k, v in (a.get("sweep") or {}).items()},
            }
            anchor_flag = ", ".join(
                f"mlx-lm {name} differs at {run['first_mismatch']}"
                for name, run in runs.items()
                if isinstance(run, dict) and run.get("first_mismatch") is not None
            )
            rows.append(
                [
                    s["label"]["suite"],
                    config_name(s["label"]),
                    r["prompt_id"],
                    r["prompt_tokens"],
                    f"{r['baseline']['decode_tok_s']:.2f}",
                    f"{r['spec']['decode_tok_s']:.2f}",
                    f"{r['speedup_e2e']:.2f}x",
                    f"{r['speedup']:.2f}x",
                    f"{r['baseline']['ttft_s']:.2f} / {r['spec']['ttft_s']:.2f}",
                    f"{r['spec']['acceptance_rate']:.0%}",
                    r["spec"]["generated_tokens"],
                    flag,
                    anchor_flag or "-",
                ]
            )
    parts.append(
        table(
            [
                "suite",
                "config",
                "prompt",
                "prompt tokens",
                "baseline tok/s",
                "spec tok/s",
                "end-to-end speed-up",
                "decode speed-up",
                "TTFT s plain / spec",
                "acceptance",
                "tokens",
                "spec == baseline",
                "anchor",
            ],
            rows,
        )
    )
    return "\n".join(parts) + "\n"


def _fmt(value, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


# ---------------------------------------------------------------- entry point


def write_report(target: str | Path) -> Path:
    """Render `report.md` and the PNGs next to the results; returns the report path."""
    from specpipe.bench.plots import draw_all

    target = Path(target)
    sources = find_results(target)
    records = list(read_records(sources))
    if not records:
        raise FileNotFoundError(f"no benchmark results (bench.jsonl) under {target}")
    out_dir = target if target.is_dir() else target.parent
    if all(is_serve_record(r) for r in records):  # specpipe-bench-serve: one line per concurrency level
        return _write_serve_report(records, out_dir, sources)
    groups = group_by_config(records)
    summaries = [summarize(rs) for rs in groups.values()]
    plots = draw_all(summaries, out_dir)
    report = out_dir / "report.md"
    report.write_text(render(summaries, groups, plots, sources), encoding="utf-8")
    return report


def _write_serve_report(records: list[dict], out_dir: Path, sources: list[Path]) -> Path:
    from specpipe.bench.plots import draw_concurrency
    from specpipe.bench.serve_report import render_serve, summarize_levels

    levels = summarize_levels(records)
    plots = draw_concurrency(levels, out_dir)
    report = out_dir / "report.md"
    report.write_text(render_serve(levels, plots, sources), encoding="utf-8")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="specpipe-bench-report", description=" ".join(__doc__.split("\n\n")[0].split())
    )  # the first paragraph, whole
    parser.add_argument("dir", help="a bench run or sweep folder (or a bench.jsonl file)")
    args = parser.parse_args(argv)
    try:
        report = write_report(args.dir)
    except (FileNotFoundError, ValueError) as exc:
        print(f"specpipe-bench-report: error: {exc}", file=sys.stderr)
        sys.exit(1)
    print(report)


if __name__ == "__main__":
    main()


def best_of(per_k: dict[int, dict]) -> dict:
    """The sweep's per-K figures and the K whose end-to-end speed-up is best: the request a user waits for,
    prefill included (decode's speed-up kept beside it)."""
    best = max(per_k, key=lambda k: per_k[k]["speedup_e2e"])
    return {
        "per_k": per_k,
        "best_k": best,
        "best_speedup": per_k[best]["speedup"],
        "best_e2e": per_k[best]["speedup_e2e"],
    }
