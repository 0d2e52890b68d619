"""A short measured check of the cost model on this machine: plain decoding against the configured drafter
under budget=auto (the cost model choosing each step's K), a few dozen tokens of the same prompt each.

Contract: `measured_check(cfg, target, tokens, repeats)` runs both, greedy, on the already loaded `target`
(the drafter is built afresh; a draft model loads again) and returns a `Check`: the cost model's price of the
drafted run's own steps (costmodel/worth.py: each step's tokens over K·c + T(K+1)/T(1), from the curve the
calibration just cached) beside the measured decode tok/s over plain's, and whether both made the same tokens.
It writes no run folder and times nothing but the two generations.

CLOSE is how the check reads agreement, not a user's choice: fixed so two machines' checks compare.
"""

from __future__ import annotations

from dataclasses import dataclass

CLOSE = 0.10  # a measured speed-up within 10% of the prediction: the cost model holds on this machine


@dataclass(frozen=True)
class Check:
    drafter: str
    tokens: int  # tokens asked of each run
    generated: int  # tokens the drafted run made (fewer at end of sequence)
    predicted: float  # the cost model's price of the drafted run's steps; 0.0 when it drafted nothing
    measured: float  # drafted run's decode tok/s over plain's
    plain_tok_s: float
    spec_tok_s: float
    acceptance: float  # accepted / drafted in the drafted run
    steps: int  # the drafted run's verify steps
    drafting_steps: int  # ... of which drafted at least one token
    same_tokens: bool

    def lines(self, label: str) -> list[str]:
        """What calibrate prints: a heading, then the prediction and the measurement, one line each."""
        same = "the same tokens as plain" if self.same_tokens else "NOT the same tokens as plain (a bug: report it)"
        made = f"{self.tokens} tokens" if self.generated >= self.tokens else f"{self.generated} tokens (EOS)"
        head = f"measured check: draft={self.drafter} budget=auto against plain, {label}, {made}, {same}"
        if self.predicted > 0:
            predicted = (
                f"  predicted {self.predicted:.2f}x vs plain: the cost model's price of the run's {self.steps} steps "
                f"({self.drafting_steps} drafted, acceptance {self.acceptance:.0%})"
            )
        else:
            predicted = (
                f"  predicted 1.00x vs plain: budget=auto drafted nothing in {self.steps} steps (no K pays for "
                f"draft={self.drafter} here), so it decoded plain"
            )
        base = self.predicted if self.predicted > 0 else 1.0
        off = self.measured / base - 1 if base else 0.0
        verdict = (
            f"within {CLOSE:.0%} of the prediction"
            if abs(off) <= CLOSE
            else f"{off:+.0%} from the prediction (it prices forwards alone: per-step host work and other processes' "
            "load are not in it)"
        )
        measured = (
            f"  measured  {self.measured:.2f}x vs plain: decode {self.spec_tok_s:.1f} tok/s against plain's "
            f"{self.plain_tok_s:.1f} tok/s; {verdict}"
        )
        return [head, predicted, measured]


def measured_check(cfg, target, tokens: int, repeats: int = 2) -> Check:
    """Plain, then the drafter under budget=auto, `repeats` times each alternately; the fastest of each kept
    (interference from other processes only ever adds time, as for the verify curve).

    Args:
        cfg: the calibration's composed config (its draft, prompt, kv, tree, ...; budget and sampling are
            replaced: auto and greedy, so the two runs must agree token for token).
        target: the calibrated target Engine, reused by both sessions.
        tokens: tokens per run.
    """
    from specpipe.config.config_groups import with_group
    from specpipe.costmodel.worth import calibrated_costs
    from specpipe.run.session import Session

    base = with_group(cfg, "sampling", "greedy")
    plain = Session(with_group(with_group(base, "draft", "none"), "budget", "fixed"), target=target)
    spec = Session(with_group(base, "budget", "auto"), target=target)
    prompt_ids = spec.encode()
    best_plain: tuple | None = None
    best_spec: tuple | None = None
    for _ in range(repeats):
        run = _generate(plain, prompt_ids, tokens)
        best_plain = run if best_plain is None or run[0].decode_tok_s > best_plain[0].decode_tok_s else best_plain
        run = _generate(spec, prompt_ids, tokens)
        best_spec = run if best_spec is None or run[0].decode_tok_s > best_spec[0].decode_tok_s else best_spec
    assert best_plain is not None and best_spec is not None  # repeats >= 1
    (p_stats, p_ids, _), (s_stats, s_ids, steps) = best_plain, best_spec
    predicted, _ = steps.estimate(*calibrated_costs(spec.budget, target, spec.drafter))
    return Check(
        drafter=spec.drafter.name,
        tokens=tokens,
        generated=s_stats.generated_tokens,
        predicted=predicted,
        measured=s_stats.decode_tok_s / p_stats.decode_tok_s if p_stats.decode_tok_s else 0.0,
        plain_tok_s=p_stats.decode_tok_s,
        spec_tok_s=s_stats.decode_tok_s,
        acceptance=s_stats.acceptance_rate,
        steps=s_stats.steps,
        drafting_steps=sum(1 for k, _, _ in steps.steps if k),
        same_tokens=p_ids == s_ids,
    )


def _generate(session, prompt_ids: list[int], tokens: int):
    """(stats, token ids, StepLog) of one generation."""
    from specpipe.costmodel.worth import StepLog
    from specpipe.metrics import StatsCollector

    collector, steps = StatsCollector(), StepLog()
    for event in session.generate(prompt_ids, max_tokens=tokens):
        collector.consume(event)
        steps.consume(event)
    return collector.stats(), collector.token_ids, steps
