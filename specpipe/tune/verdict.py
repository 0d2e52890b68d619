"""From measured outcomes to what the user reads: one verdict per task kind, the table, the winning setup.

Contract: `summarise(outcome)` -> per option (auto, K=4, ...) its geo-mean end-to-end speed-up over plain
decoding (the whole request, prefill included: what verdicts and the winner choose by), its decode speed-up,
acceptance, tokens per target forward, p50 / p99 gaps and losslessness; `verdicts(outcomes, pays_at)` ->
one line per kind, in words; `table(outcomes)` -> Markdown rows; `winner(outcomes, pays_at)` -> the
(candidate, budget) to write as a preset. An option whose output differed from plain decoding's is never a
winner. Pure functions over dicts: nothing here measures.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from specpipe.tune.plan import Candidate
from specpipe.tune.routine import Outcome

NOISE = 1.05  # a speed-up this far above tokens per forward is the machine's noise, not the drafter's


@dataclass(frozen=True)
class Option:
    name: str  # "auto" or "K=8"
    # geo-mean over prompts of end-to-end tok/s (the whole request, prefill included) over plain decoding's, same
    # prompt, back to back: what a user waits for, and what the verdict and the winner choose by
    speedup: float
    decode: float  # the same of decode tok/s (prefill left out): kept as a column
    acceptance: float
    tokens_per_forward: float
    p50_ms: float
    p99_ms: float
    lossless: bool
    prompts: int

    @property
    def credible(self) -> float:
        """The speed-up, capped at tokens per forward: a step's forward costs at least T(1), so more is noise."""
        return min(self.speedup, self.tokens_per_forward)

    def budget_words(self) -> str:
        return "budget=auto" if self.name == "auto" else f"budget=fixed budget.k={self.name[2:]}"


def summarise(outcome: Outcome) -> list[Option]:
    out = []
    for name, runs in outcome.options.items():
        if not runs:
            continue
        out.append(
            Option(
                name=name,
                speedup=_geomean([r.get("speedup_e2e", r["speedup"]) for r in runs]),  # older records: decode only
                decode=_geomean([r["speedup"] for r in runs]),
                acceptance=statistics.fmean(r.get("acceptance_rate", 0.0) for r in runs),
                tokens_per_forward=statistics.fmean(r.get("tokens_per_forward", 0.0) for r in runs),
                p50_ms=statistics.median(r.get("latency_ms", {}).get("p50", 0.0) for r in runs),
                p99_ms=statistics.median(r.get("latency_ms", {}).get("p99", 0.0) for r in runs),
                lossless=all(r["lossless"] for r in runs),
                prompts=len(runs),
            )
        )
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(max(v, 1e-9)) for v in values))


def best_of(outcomes: list[Outcome]) -> tuple[Outcome, Option] | None:
    """The fastest lossless option over these outcomes."""
    pairs = [(o, opt) for o in outcomes for opt in summarise(o) if opt.lossless]
    return max(pairs, key=lambda p: p[1].credible) if pairs else None


def verdicts(outcomes: list[Outcome], pays_at: float) -> list[str]:
    lines = []
    for kind in dict.fromkeys(o.kind.name for o in outcomes):
        mine = [o for o in outcomes if o.kind.name == kind and not o.skipped]
        bad = [f"{o.candidate.label()} {opt.name}" for o in mine for opt in summarise(o) if not opt.lossless]
        warn = f" (NOT LOSSLESS, left out: {'; '.join(bad)})" if bad else ""
        best = best_of(mine)
        if best is None:
            lines.append(f"{kind}: nothing measured{warn}")
            continue
        o, opt = best
        auto = next((a for a in summarise(o) if a.name == "auto"), None)
        if opt.credible < pays_at:  # 1.28x at 1.00 tokens per forward is a slowed baseline, not a gain
            fallback = f" ({auto.speedup:.2f}x)" if auto else ""
            said = f"best {opt.speedup:.2f}x"
            if opt.speedup > opt.credible:
                said += (
                    f" measured, of which its {opt.tokens_per_forward:.2f} tokens per forward allow {opt.credible:.2f}x"
                )
            lines.append(
                f"{kind}: speculation does not pay here ({said}: {o.candidate.label()} "
                f"{opt.budget_words()}); keep budget=auto, which falls back to plain decoding{fallback}{warn}"
            )
            continue
        beside = f", budget=auto {auto.speedup:.2f}x" if auto and opt.name != "auto" else ""
        noisy = ""
        if opt.speedup > NOISE * opt.tokens_per_forward:
            noisy = (
                f"; more than its {opt.tokens_per_forward:.2f} tokens per forward can give, so plain decoding was "
                "slowed by other work between runs: rerun with repeats=2 on a quieter machine"
            )
        lines.append(
            f"{kind}: {opt.speedup:.2f}x end to end (decode {opt.decode:.2f}x) with {o.candidate.label()} "
            f"{opt.budget_words()} (acceptance {opt.acceptance:.0%}, {opt.tokens_per_forward:.2f} tokens per forward"
            f"{beside}{noisy}){warn}"
        )
    return lines


def table(outcomes: list[Outcome]) -> list[str]:
    head = (
        "| kind | drafter | budget | prompts | end-to-end speed-up | decode speed-up | acceptance | tok / forward "
        "| p50 / p99 ms | equal to plain |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        if o.skipped:
            lines.append(f"| {o.kind.name} | {o.candidate.label()} | - | - | skipped: {o.skipped} | | | | | |")
            continue
        for opt in summarise(o):
            lines.append(
                f"| {o.kind.name} | {o.candidate.label()} | {opt.name} | {opt.prompts} | {opt.speedup:.2f}x | "
                f"{opt.decode:.2f}x | "
                f"{opt.acceptance:.0%} | {opt.tokens_per_forward:.2f} | {opt.p50_ms:.0f} / {opt.p99_ms:.0f} | "
                f"{'yes' if opt.lossless else '**NO**'} |"
            )
    return lines


def winner(outcomes: list[Outcome], pays_at: float) -> tuple[Candidate, str]:
    """The (candidate, "auto" | "K=n") whose geo-mean end-to-end speed-up over every kind is best.

    `budget=auto` wins ties within 5 % and wherever a fixed K would lose on some kind (auto falls back to
    plain decoding where speculation does not pay; a fixed K does not). With nothing measured, n-gram + auto.
    """
    kinds = list(dict.fromkeys(o.kind.name for o in outcomes))
    scores: dict[tuple[str, str], list[Option]] = {}
    by_spec = {o.candidate.spec: o.candidate for o in outcomes}
    for o in outcomes:
        for opt in summarise(o):
            scores.setdefault((o.candidate.spec, opt.name), []).append(opt)
    ranked = []
    for (spec, name), opts in scores.items():
        if len(opts) < len(kinds) or not all(opt.lossless for opt in opts):
            continue  # measured on every kind, equal to plain on every kind
        if name != "auto" and min(opt.speedup for opt in opts) < 1.0 / 1.03:
            continue  # a fixed K that loses somewhere is not a setting to leave on
        # a step's forward costs at least T(1), so a speed-up above tokens per forward is noise: rank by at most that
        geo = math.exp(statistics.fmean(math.log(max(opt.credible, 1e-9)) for opt in opts))
        ranked.append((geo, spec, name))
    if not ranked:
        first = outcomes[0].candidate if outcomes else Candidate("ngram", "ngram")
        return first, "auto"
    geo, spec, name = max(ranked)
    auto = next((g for g, s, n in ranked if s == spec and n == "auto"), None)
    if name != "auto" and auto is not None and auto >= geo / 1.05:
        name = "auto"
    return by_spec[spec], name
