"""Run statistics built from the event stream alone (no mlx here).

Definitions (vLLM's vocabulary):
- acceptance rate = accepted / drafted
- acceptance length = 1 + accepted / steps (the +1 is the recovered/bonus token)
- tokens per forward = generated tokens / target forwards after prefill
- draft forwards: summed from the Drafted events of this run, by purpose
  (drafting, probe, catch-up, hindsight, wasted); never a drafter's lifetime
  counter, which a session's earlier runs would inflate.
- per source (draft=chain: the source; draft=suffix: history or context): a step's drafted and accepted
  tokens count for the source its Drafted event names (`drafted_by_source`, `accepted_by_source`); other
  drafters' steps name none.
- latency: per-token gaps; an emission of m tokens arriving `gap` seconds
  after the previous one counts as m gaps of gap/m (time per output token).
"""

from __future__ import annotations

import resource
import sys

from specpipe.events import (
    Drafted,
    DraftPrefilled,
    Emitted,
    Event,
    LatencyStats,
    PrefillDone,
    RunStarted,
    RunStats,
    Verified,
)


class StatsCollector:
    """Feed it every event with `consume`; ask for `stats()` at any time."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.cached_tokens = 0  # of those, taken from the prefix store (PrefillDone.cached_tokens)
        self.prefill_s = 0.0
        self.target_prefill_s = 0.0
        self.draft_prefill_s = 0.0
        self.draft_s = 0.0  # Drafted.seconds summed: the decode time spent drafting
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.draft_forwards = 0
        self.hindsight_checked = 0
        self.hindsight_matched = 0
        self.forwards_by = dict.fromkeys(("drafting", "probe", "catchup", "hindsight", "wasted"), 0)
        self.probe_steps = 0
        self.draft_prefill = ""  # budget=auto's choice of the draft's prefill (BudgetDecision.prefill)
        self.tree_steps = self.tree_nodes = self.tree_path = 0
        self.position_drafted: list[int] = []  # per draft position i: steps that drafted more than i tokens
        self.position_accepted: list[int] = []  # ... and steps whose accepted prefix reached past i
        self._overlap: list[float] = []
        self._pending_draft = 0
        self._step_source: dict[int, str] = {}  # step -> Drafted.source, until its Verified
        self.by_source: dict[str, list[int]] = {}  # source -> [drafted, accepted]
        self.token_ids: list[int] = []
        self.text_parts: list[str] = []
        self.gaps_s: list[float] = []  # per emitted token, seconds (see the module docstring)
        self._first_emit_t: float | None = None
        self._last_emit_t = 0.0
        self._prefill_end_t = 0.0
        self._deferred_s = 0.0  # DraftPrefilled seconds inside the decode window

    def consume(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.prompt_tokens = len(event.prompt_ids)
        elif isinstance(event, PrefillDone):
            self.prefill_s = event.seconds
            self.prompt_tokens = self.prompt_tokens or event.tokens  # a pipeline run without RunStarted
            self.target_prefill_s = event.target_seconds or event.seconds  # older recordings: no split
            self.draft_prefill_s = event.draft_seconds
            self.cached_tokens = event.cached_tokens
            self._prefill_end_t = event.t
            self._last_emit_t = event.t
        elif isinstance(event, DraftPrefilled):
            # a draft model's prefill after the first token: prefill, not decoding (mlx-lm's anchor prefills
            # its draft before its clock too); the wait shows in the gap before the next tokens
            self.draft_prefill_s += event.seconds
            self._deferred_s += event.seconds
        elif isinstance(event, Drafted):
            self.drafted += len(event.draft_ids)
            self.draft_s += event.seconds
            self.hindsight_checked += len(event.hindsight_ids)
            self.hindsight_matched += event.hindsight_matched
            self.draft_forwards += event.forwards
            self.forwards_by["probe" if event.probe else "drafting"] += event.draft_forwards
            self.forwards_by["catchup"] += event.catchup_forwards
            self.forwards_by["hindsight"] += event.hindsight_forwards
            self.forwards_by["wasted"] += event.wasted_forwards
            self.probe_steps += event.probe
            if event.decision is not None and event.decision.prefill:
                self.draft_prefill = event.decision.prefill
            if event.source and event.draft_ids:
                self._step_source[event.step] = event.source
        elif isinstance(event, Verified):
            self.steps += 1
            n, k = len(event.accepted_ids), len(event.accepted_ids) + len(event.rejected_ids)
            self.accepted += n
            source = self._step_source.pop(event.step, "")
            if source:
                counts = self.by_source.setdefault(source, [0, 0])
                counts[0], counts[1] = counts[0] + k, counts[1] + n
            if event.tree_depth:  # a tree: positions are depths, a depth is accepted when the path reached it
                self.tree_steps += 1
                self.tree_nodes += k
                self.tree_path += n
                k = event.tree_depth
            self._overlap.extend(event.overlap)
            while len(self.position_drafted) < k:
                self.position_drafted.append(0)
                self.position_accepted.append(0)
            for i in range(k):  # position i counts as accepted when the prefix reached past it
                self.position_drafted[i] += 1
                self.position_accepted[i] += i < n
        elif isinstance(event, Emitted) and event.token_ids:
            if self._first_emit_t is None:
                self._first_emit_t = event.t
            m = len(event.token_ids)
            self.gaps_s.extend([(event.t - self._last_emit_t) / m] * m)
            self._last_emit_t = event.t
            self.token_ids.extend(event.token_ids)
            self.text_parts.append(event.text)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def stats(self, draft_forwards: int | None = None, peak_memory_bytes: int = 0, wall_s: float = 0.0) -> RunStats:
        """Figures so far. `draft_forwards` overrides the events' sum (recordings made before it was kept)."""
        by = self.forwards_by
        generated = len(self.token_ids)
        decode_s = self._last_emit_t - self._prefill_end_t - self._deferred_s
        return RunStats(
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            generated_tokens=generated,
            steps=self.steps,
            target_forwards=self.steps,
            draft_forwards=self.draft_forwards if draft_forwards is None else draft_forwards,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=self.accepted / self.drafted if self.drafted else 0.0,
            acceptance_length=1 + self.accepted / self.steps if self.steps else 0.0,
            acceptance_by_position=[a / d for a, d in zip(self.position_accepted, self.position_drafted)],
            expected_acceptance=sum(self._overlap) / len(self._overlap) if self._overlap else 0.0,
            tokens_per_forward=generated / self.steps if self.steps else 0.0,
            # the prompt tokens the target fed: those from the prefix store took no forward
            prefill_tok_s=(self.prompt_tokens - self.cached_tokens) / self.target_prefill_s
            if self.target_prefill_s
            else 0.0,
            prefill_s=self.prefill_s,
            draft_prefill_s=self.draft_prefill_s,
            draft_s=self.draft_s,
            decode_tok_s=generated / decode_s if decode_s > 0 else 0.0,
            ttft_s=self._first_emit_t or 0.0,
            wall_s=wall_s,
            latency_ms=percentiles_ms(self.gaps_s),
            peak_memory_bytes=peak_memory_bytes,
            peak_rss_bytes=peak_rss_bytes(),
            hindsight_checked=self.hindsight_checked,
            hindsight_matched=self.hindsight_matched,
            draft_forwards_drafting=by["drafting"],
            draft_forwards_probe=by["probe"],
            draft_forwards_catchup=by["catchup"],
            draft_forwards_hindsight=by["hindsight"],
            draft_forwards_wasted=by["wasted"],
            probe_steps=self.probe_steps,
            tree_steps=self.tree_steps,
            tree_nodes_per_step=self.tree_nodes / self.tree_steps if self.tree_steps else 0.0,
            tree_path_length=self.tree_path / self.tree_steps if self.tree_steps else 0.0,
            drafted_by_source={s: c[0] for s, c in self.by_source.items()},
            accepted_by_source={s: c[1] for s, c in self.by_source.items()},
            draft_prefill=self.draft_prefill,
        )


def percentiles_ms(gaps_s: list[float]) -> LatencyStats:
    """p50/p95/p99 of gaps in seconds, reported in milliseconds (nearest rank)."""
    if not gaps_s:
        return LatencyStats()
    ordered = sorted(gaps_s)

    def rank(q: float) -> float:
        return 1000.0 * ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return LatencyStats(p50=rank(0.50), p95=rank(0.95), p99=rank(0.99))


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
