"""The seeds' routine, measured through the bench's own loop: each candidate and task kind under
`budget=auto` beside fixed K = 4 / 8, then longer K only where the later draft positions held. A suite of
sessions (suite=sessions: history carried from request to request) measures each fixed K as a run of its own.

Contract: `measure_all(cfg, candidates, kinds, results, progress)` calls `specpipe.bench.harness.run_bench`
for every measurement (it appends each finished prompt to `results` and, with resume, skips the prompts
already there: an interrupted tune resumes), and returns one Outcome per (candidate, kind): the records of
each option (auto, K=4, ...) or why the candidate was skipped (a tokenizer that differs, a tree on a
recurrent target: the bench's own one-line errors). `probe_target` describes the target first:
architecture, the rollback it needs, the BLAS and the calibrated verify curve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specpipe.errors import ConfigError, SpecpipeError
from specpipe.tune.plan import Candidate, Kind, bench_node, config_hash_of


@dataclass
class Outcome:
    candidate: Candidate
    kind: Kind
    options: dict[str, list[dict]] = field(default_factory=dict)  # "auto" / "K=8" -> one run dict per prompt
    skipped: str | None = None  # why nothing was measured


# ---------------------------------------------------------------- the target


def probe_target(node) -> list[str]:
    """Lines about the target: what it is, the rollback it needs, the BLAS and the verify curve T(n)/T(1)."""
    from specpipe.bench.harness import _shared_target  # the bench's one loaded target, reused by every run below
    from specpipe.costmodel.calibration import verify_cost_curve
    from specpipe.engine.load.blas import blas_info, blas_phrase
    from specpipe.rollbacks.layers import kinds, split

    target = _shared_target(node)
    info = target.info
    layers = split(target.make_cache())
    if layers.recurrent:
        rollback = (
            f"recurrent layers ({kinds(layers.recurrent)}): rollback=auto checkpoints or recomputes per step "
            "(docs/rollback.md); token trees are refused"
        )
    else:
        rollback = "attention only: a rejected draft costs a cache truncation (rollback=trim)"
    # timed now, not read from the cache: a curve cached while the machine was busy misprices every K for auto
    # (seen here: T(1) 440 ms and T(17) 0.48 T(1)); 7 lengths, a few seconds for a small model
    curve = verify_cost_curve(target, quick=True, refresh=True)
    shown = [n for n in (2, 3, 5, 9, 17, 33) if n in curve["ratio"]]
    points = ", ".join(f"T({n}) {curve['ratio'][n]:.2f}" for n in shown)
    return [
        f"target {info.name} ({info.arch}, {info.precision}), {blas_phrase(blas_info())}",
        f"rollback: {rollback}",
        f"verify cost over T(1) = {1000 * curve['t1_s']:.0f} ms: {points} (timed now; budget=auto reads it)",
    ]


def has_recurrent_layers(node) -> bool:
    from specpipe.bench.harness import _shared_target
    from specpipe.rollbacks.layers import split

    return bool(split(_shared_target(node).make_cache()).recurrent)


# ---------------------------------------------------------------- measurements


def records_of(results: Path, node) -> list[dict]:
    """This measurement's records of the suite's prompts as they read now (a prompt's older text is not one)."""
    from specpipe.bench.records import ResultsFile, load_suite, prompt_key

    chash = config_hash_of(node)
    s = node.suite
    keys = {prompt_key(p) for p in load_suite(s.name, s.path, node.limit, s.format, s.per_category, s.second_turns)}
    return [r for r in ResultsFile(results).records() if r.get("config_hash") == chash and r.get("prompt_key") in keys]


def carries_history(node) -> bool:
    """Whether the measurement's suite runs requests in sessions (suite=sessions), history carried between them."""
    from specpipe.bench.records import load_suite

    s = node.suite
    try:
        prompts = load_suite(s.name, s.path, node.limit, s.format, s.per_category, s.second_turns)
    except SpecpipeError:
        return False  # the measurement itself says what is wrong with the suite, and is skipped
    return any("session" in p for p in prompts)


def tail_acceptance(runs: list[dict], k: int) -> float:
    """Acceptance over draft positions k/2+1..k, pooled over prompts: do long drafts still hold at their end?"""
    lo = k // 2
    drafted = sum(sum(run.get("drafted_at", [])[lo:k]) for run in runs)
    accepted = sum(sum(run.get("accepted_at", [])[lo:k]) for run in runs)
    return accepted / drafted if drafted else 0.0


def measure(cfg, node, results: Path, progress) -> list[dict]:
    """One bench run (resumed from `results`); its records, every prompt's, including ones measured before."""
    from specpipe.bench.harness import run_bench

    run_bench(node, results, log=progress.line)
    found = records_of(results, node)
    progress.settle(len(found))
    return found


def measure_all(cfg, candidates: list[Candidate], kinds: list[Kind], results: Path, progress) -> list[Outcome]:
    outcomes = []
    ks = sorted(set(cfg.ks))
    for candidate in candidates:
        for kind in kinds:
            outcome = Outcome(candidate, kind)
            outcomes.append(outcome)
            # a multi-request suite (suite=sessions) carries history from request to request: a fixed K beside
            # auto would draft from auto's answers, so each fixed K is a run of its own there
            separate = carries_history(bench_node(cfg, candidate, kind, None, [], results))
            first = bench_node(cfg, candidate, kind, None, [] if separate else ks, results)
            progress.plan(outcome_label(outcome), first)
            try:
                recs = measure(cfg, first, results, progress)
            except ConfigError:
                raise  # the user's own overrides are wrong for every candidate: stop here
            except SpecpipeError as e:
                outcome.skipped = str(e)
                progress.skip(outcome_label(outcome), str(e))
                continue
            outcome.options["auto"] = [spec_run(r) for r in recs]
            for k in ks:
                if separate:
                    node = bench_node(cfg, candidate, kind, k, [], results)
                    progress.plan(f"{outcome_label(outcome)} K={k}", node)
                    outcome.options[f"K={k}"] = [spec_run(r) for r in measure(cfg, node, results, progress)]
                    continue
                outcome.options[f"K={k}"] = [
                    fixed_run(r, str(k)) for r in recs if r.get("fixed") and str(k) in r["fixed"]
                ]
            last = max(ks) if ks else 0
            held = tail_acceptance(outcome.options.get(f"K={last}", []), last)
            for k in sorted(set(cfg.widen_to)):
                if k <= last or held < cfg.widen_at:
                    break  # the longest K so far did not hold to its end: a longer one would hold less
                node = bench_node(cfg, candidate, kind, k, [], results)
                progress.plan(f"{outcome_label(outcome)} K={k} (K={last}'s later positions held {held:.0%})", node)
                recs = measure(cfg, node, results, progress)
                outcome.options[f"K={k}"] = [spec_run(r) for r in recs]
                held, last = tail_acceptance(outcome.options[f"K={k}"], k), k
    return outcomes


def spec_run(record: dict) -> dict:
    """A record's speculative run with what the record holds about it: its speed-up and its token check."""
    return record["spec"] | {
        "prompt_id": record["prompt_id"],
        "category": record.get("category"),
        "speedup": record["speedup"],
        "speedup_e2e": record["speedup_e2e"],
        "lossless": record["tokens_match"],
    }


def fixed_run(record: dict, k: str) -> dict:
    """A record's fixed-K run beside the budget (its speed-up is already over the same baseline)."""
    run = record["fixed"][k]
    base = record["baseline"]["e2e_tok_s"]
    return run | {
        "speedup_e2e": run["e2e_tok_s"] / base if base else 0.0,
        "prompt_id": record["prompt_id"],
        "category": record.get("category"),
        "lossless": run["first_mismatch"] is None,
    }


def by_category(outcomes: list[Outcome]) -> list[Outcome]:
    """A Spec-Bench kind becomes one outcome per task (its records name it), so each task gets its verdict."""
    out = []
    for o in outcomes:
        categories = sorted({run["category"] for runs in o.options.values() for run in runs if run.get("category")})
        if not categories or o.skipped:
            out.append(o)
            continue
        for category in categories:
            kind = Kind(name=category, suite=None, path=o.kind.path, format=o.kind.format)
            options = {name: [r for r in runs if r.get("category") == category] for name, runs in o.options.items()}
            out.append(Outcome(o.candidate, kind, options))
    return out


def outcome_label(outcome: Outcome) -> str:
    return f"{outcome.kind.name}: {outcome.candidate.label()}"
