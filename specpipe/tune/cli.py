"""`specpipe-tune`: the fastest lossless setup for the user's prompts on this machine, written as a preset.

Contract: a Hydra command over conf/tune.yaml (the bench's groups and keys plus `drafts`, `suites`,
`prompts.file`, `ks`, `widen_to`, `save_as`). It describes the target (stderr), measures every candidate
and task kind through the bench's loop with a progress bar and ETA on a terminal (routine.py), then prints
one verdict per task kind, the table, and where the preset went (stdout). Every finished measurement is a
line of `outputs/tune/<save_as>.jsonl`, so the same command run again skips what is done (`fresh=true`
starts over). Errors are one line (specpipe/cli/shell.py); a stop keeps every finished measurement.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import specpipe.tune.config  # noqa: F401  (registers tune_schema before Hydra composes)
from specpipe.cli.shell import Stopped, hydra_main

TOOL = "specpipe-tune"


def main() -> None:
    hydra_main(TOOL, "tune", _task, interrupted=": nothing was measured yet")


class Progress:
    """A tqdm bar with an ETA on a terminal (one tick per measured prompt); plain lines otherwise."""

    def __init__(self, total: int, stream=sys.stderr):
        self.stream = stream
        self.started = time.perf_counter()
        self.done = 0
        self.bar = None
        if stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, file=stream, unit="prompt", dynamic_ncols=True, desc="tune")

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(f"[tune] {text}", file=self.stream)
        else:
            print(f"[tune] {text}", file=self.stream, flush=True)

    def plan(self, label: str, node) -> None:
        self.before = self.done
        self.note(label)

    def line(self, text: str) -> None:
        """run_bench's log: a `[bench i/n]` line is one measured prompt."""
        if text.startswith("[bench ") and text[7:8].isdigit():
            self.done += 1
            if self.bar is not None:
                self.bar.update(1)
                return
        if self.bar is None:
            print(f"  {text}", file=self.stream, flush=True)

    def settle(self, measured: int) -> None:
        """After a run: prompts skipped by resume count as done too."""
        grown = self.before + measured - self.done
        if grown > 0:
            self.done += grown
            if self.bar is not None:
                self.bar.update(grown)

    def grow(self, n: int) -> None:
        if self.bar is not None:
            self.bar.total += n
            self.bar.refresh()

    def skip(self, label: str, why: str) -> None:
        self.note(f"{label}: skipped: {why}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _task(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    from specpipe.bench.records import load_suite
    from specpipe.tune.plan import bench_node, parse_candidate, task_kinds
    from specpipe.tune.preset import check_name, write_preset
    from specpipe.tune.routine import by_category, has_recurrent_layers, measure_all, probe_target
    from specpipe.tune.verdict import summarise, table, verdicts, winner

    check_name(cfg.save_as)
    candidates = [parse_candidate(spec) for spec in cfg.drafts]
    if not candidates:
        from specpipe.errors import ConfigError

        raise ConfigError("drafts=[]: name at least one candidate (drafts=[ngram])")
    results = Path(cfg.results) if cfg.results else Path("outputs/tune") / f"{cfg.save_as}.jsonl"
    if cfg.fresh and results.exists():
        results.unlink()
    kinds = task_kinds(cfg, results.parent)
    first = bench_node(cfg, candidates[0], kinds[0], None, list(cfg.ks), results)
    per_kind = {
        k.name: len(
            load_suite(  # as the bench will run them: Spec-Bench's MT-Bench second turns included (suite yaml)
                k.suite or "code",
                k.path,
                None if k.format == "spec-bench" else cfg.limit,
                k.format,
                k.per_category,
                second_turns=True,
            )
        )
        for k in kinds
    }
    progress = Progress(sum(per_kind.values()) * len(candidates))
    try:
        for line in probe_target(first):
            progress.note(line)
        if any(c.tree for c in candidates) and has_recurrent_layers(first):
            progress.note("token trees need an attention-only target: the /tree candidates are left out")
            candidates = [c for c in candidates if not c.tree]
        outcomes = measure_all(cfg, candidates, kinds, results, _Growing(progress, per_kind))
    except KeyboardInterrupt:
        if not results.exists():
            raise
        raise Stopped(f": every finished measurement is in {results}; run the same command again to resume") from None
    finally:
        progress.close()
    outcomes = by_category(outcomes)  # Spec-Bench: a verdict per task
    lines = verdicts(outcomes, cfg.pays_at)
    for line in lines:
        print(line)
    print()
    print("\n".join(table(outcomes)))
    candidate, option = winner(outcomes, cfg.pays_at)
    choices = dict(HydraConfig.get().runtime.choices)
    path = write_preset(cfg, choices, candidate, option, cfg.save_as, lines)
    budget = next((o.budget_words() for out in outcomes for o in summarise(out) if o.name == option), "budget=auto")
    why = (
        "the best over every kind, or within 5% of a fixed K that is, and plain decoding where drafts do not pay"
        if option == "auto"
        else "the best over every kind, and slower than plain on none"
    )
    print(f"\npreset {cfg.save_as}: {candidate.label()} {budget} ({why}) -> {path}")
    print(
        f"use it: specpipe preset={cfg.save_as} | specpipe-chat preset={cfg.save_as} | "
        f"specpipe-serve preset={cfg.save_as}"
    )
    print(
        f"{TOOL}: {len(candidates)} candidate(s) x {sum(per_kind.values())} prompt(s), each option checked against "
        f"plain decoding; results in {results}",
        file=sys.stderr,
    )


class _Growing:
    """The progress sink routine.py sees: widening a K adds that kind's prompts to the bar's total."""

    def __init__(self, progress: Progress, per_kind: dict[str, int]):
        self.p, self.per_kind = progress, per_kind

    def plan(self, label: str, node) -> None:
        if " K=" in label:  # a widening run: more prompts than the bar planned
            self.p.grow(self.per_kind.get(label.split(":", 1)[0], 0))
        self.p.plan(label, node)

    def __getattr__(self, name):
        return getattr(self.p, name)


if __name__ == "__main__":
    main()
