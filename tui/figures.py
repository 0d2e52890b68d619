"""Live speculation figures of the current run, computed from events alone.

Everything here comes from event fields (`t`, ids, RunFinished.stats), never
from wall clocks, so a scripted or replayed run shows the same numbers every
time. Definitions are specpipe.metrics' (acceptance rate, tokens per forward).
"""

from __future__ import annotations

import msgspec

from specpipe.costmodel.worth import Estimate, StepLog, phrase, priced_estimate
from specpipe.events import Drafted, RunError, RunFinished, RunStarted, Verified
from specpipe.metrics import StatsCollector

SPARK_STEPS = 60  # steps kept for the acceptance sparkline


class Figures:
    """Consume every event of a chat; read the attributes to draw the panel."""

    def __init__(self) -> None:
        self.target = self.drafter = self.budget = self.rollback = self.compare = "-"
        self.config_yaml = ""
        self.tree = ""  # tree != chain: the shape label RunStarted carries
        self.vocab_map = ""  # a draft with another tokenizer: its token map and the ids both share
        self.k: int | None = None  # K of the latest step
        self.source = ""  # the latest step's Drafted.source: a chain's source, or suffix's history | context
        self.k_label = ""  # a served chat: the server's K as its budget label gives it (figures.served_k)
        self.step_rates: list[float] = []  # acceptance rate per step, whole chat
        self.stop_reason = ""
        self.peak_memory_bytes = 0  # MLX's own counter (0 where it has none)
        self.peak_rss_bytes = 0  # the process's resident peak: what the CLI's summary line says
        self.running = False
        self._steps = StepLog()  # the "vs plain" estimate: the CLI summary's own function, per answer
        self._costs: tuple[dict[int, float] | None, float | None] = (None, None)
        self._collector = StatsCollector()
        self._step_k: dict[int, int] = {}
        self.warnings: list[str] = []  # settings the cost model predicts slower than plain (RunStarted.warnings)
        self.served = False  # answers from specpipe-serve (tui/server_source.py)
        self._finished = None  # their RunFinished.stats: the server's drafted / accepted / tokens per forward

    def consume(self, event) -> None:
        if isinstance(event, RunStarted):
            self._collector = StatsCollector()  # figures are per answer; the sparkline spans the chat
            self._steps = StepLog()
            self._costs = (event.verify_ratio, event.draft_cost)
        self._collector.consume(event)
        self._steps.consume(event)
        if isinstance(event, RunStarted):
            self.target, self.drafter = event.target.name, event.drafter
            self.budget, self.rollback, self.compare = event.budget, event.rollback, event.compare
            self.config_yaml = event.config_yaml or self.config_yaml
            self.tree = event.tree
            self.vocab_map = vocab_map_label(event.draft_vocab_map, event.draft_vocab_shared)
            self.warnings = list(event.warnings)
            self.served = event.target.source == "server"  # no step events: the figures come with RunFinished
            self.k_label = served_k(event.budget) if self.served else ""
            self.stop_reason, self.running, self.peak_memory_bytes, self.peak_rss_bytes = "", True, 0, 0
        elif isinstance(event, Drafted):
            self.k = event.k
            self.source = event.source if event.draft_ids else ""
            self._step_k[event.step] = len(event.draft_ids)
        elif isinstance(event, Verified):
            drafted = self._step_k.pop(event.step, 0)
            drafted = event.tree_depth or drafted  # a tree: how deep its accepted path got, not nodes kept
            if drafted:  # plain-decoding steps draft nothing: no rate to plot
                self.step_rates = (self.step_rates + [len(event.accepted_ids) / drafted])[-SPARK_STEPS:]
        elif isinstance(event, RunFinished):
            self.stop_reason, self.running = event.stop_reason, False
            self._finished = event.stats if self.served else None
            self.peak_memory_bytes, self.peak_rss_bytes = event.stats.peak_memory_bytes, event.stats.peak_rss_bytes
        elif isinstance(event, RunError):
            self.stop_reason, self.running = "error", False

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) rows for the stats panel."""
        s = self._collector.stats()
        if self._finished is not None:  # a served answer: the server counted its steps, not our events
            s = msgspec.structs.replace(
                self._finished, decode_tok_s=self._finished.decode_tok_s or s.decode_tok_s, ttft_s=s.ttft_s
            )
        rate = f"{s.acceptance_rate:.0%} ({s.accepted}/{s.drafted})" if s.drafted else "-"
        speculating = self.drafter != "none"  # plain decoding has no budget, K or acceptance to show
        estimate = self.estimate()
        return [
            *([("acceptance", rate)] if speculating else []),
            ("tok/forward", f"{s.tokens_per_forward:.2f}" if s.steps else "-"),
            ("tok/s", f"{s.decode_tok_s:.1f}" if s.decode_tok_s else "-"),
            *([("vs plain", _short(estimate) if estimate.value > 0 else "-")] if speculating else []),
            ("TTFT", f"{s.ttft_s:.2f} s" if s.ttft_s else "-"),
            # the prompt tokens the prefix store held (an earlier turn's prompt and answer): never prefilled
            *([("cached", f"{s.cached_tokens} of {s.prompt_tokens} prompt")] if s.cached_tokens else []),
            ("tokens", f"{s.generated_tokens} in {s.steps} steps"),
            *([("K", self._k_shown())] if speculating else []),
            # draft=chain: accepted / drafted per source this answer; draft=suffix: from history or the context
            *(
                [(self._source_label(), by_source(s.drafted_by_source, s.accepted_by_source))]
                if s.drafted_by_source
                else []
            ),
            ("drafter", self.drafter),
            *([("vocab map", self.vocab_map)] if self.vocab_map else []),
            *([("budget", self.budget)] if speculating else []),
            *([("tree", short_tree(self.tree))] if self.tree else []),
            ("rollback", self.rollback),
            ("compare", self.compare),
            ("target", self.target),
            ("peak mem", self._memory_shown()),
            ("stop", self.stop_reason or ("running" if self.running else "-")),
            # the lines themselves are a notice when they first arrive, and head the F2 config screen
            *([("warning", "slower (see F2)")] if self.warnings else []),
        ]

    def estimate(self) -> Estimate:
        """This answer's speed-up against plain decoding and its range, as the CLI's summary estimates them
        (from RunStarted's costs, so a replay shows the same); value 0.0: none."""
        if self.served:  # a served answer's steps are the server's; its events carry no step timings
            return Estimate()
        return priced_estimate(self._steps, *self._costs)

    def _source_label(self) -> str:
        """draft=suffix drafts from earlier requests (history) or this one (context); a chain from its sources."""
        return "drafted from" if self.drafter == "suffix" else "sources"

    def _k_shown(self) -> str:
        """The budget's K for the latest step and the budget it comes from: "4 of fixed(k=8)";
        a chain adds the source that drafted it: "4 (ngram) of fixed(k=8)"."""
        if self.k is None:
            return self.k_label or "-"
        k = f"{self.k} ({self.source})" if self.source else str(self.k)
        return k if self.served or self.budget == "-" else f"{k} of {self.budget}"

    def _memory_shown(self) -> str:
        """Resident (the CLI's figure) and MLX's own counter, each labelled: "810 MiB RSS, 528 MLX"."""
        parts = [f"{self.peak_rss_bytes / 2**20:.0f} MiB RSS"] if self.peak_rss_bytes else []
        if self.peak_memory_bytes:
            parts.append(f"{self.peak_memory_bytes / 2**20:.0f} {'MLX' if parts else 'MiB MLX'}")
        return ", ".join(parts) or "-"


def paid_note(figures: Figures, note: str) -> str:
    """The line under a finished answer with whether speculation paid: "~2.1x vs plain (estimated)", or
    "~0.7x vs plain (estimated): speculation did not pay"; `note` (a stop reason) kept in front."""
    x = figures.estimate() if figures.drafter != "none" else Estimate()
    if x.value <= 0:
        return note
    line = phrase(x.value, x.low, x.high) + (": speculation did not pay" if x.value < 1.0 else "")
    return f"{note}  {line}" if note else line


def _short(x: Estimate) -> str:
    """The panel's narrow form, "~2.1x (est.)": its range is in the line under the answer (`paid_note`)."""
    return f"~{x.value:.1f}x (est.)"


def by_source(drafted: dict[str, int], accepted: dict[str, int]) -> str:
    """Accepted / drafted per chained source: {"ngram": 12, "model": 8} drafted -> "ngram 9/12, model 5/8"."""
    return ", ".join(f"{name} {accepted.get(name, 0)}/{n}" for name, n in drafted.items())


def vocab_map_label(method: str, shared: int | None) -> str:
    """How a draft with another tokenizer reaches the target's ids: "intersection (238 shared)"; "" for none."""
    if not method:
        return ""
    return f"{method} ({shared} shared)" if shared is not None else method


def served_k(budget: str) -> str:
    """K as a server's budget label gives it: fixed(k=4) -> "4", auto(k_max=16) -> "auto <= 16"."""
    for key, shown in (("(k=", "{}"), ("(k_max=", "auto <= {}")):
        if key in budget:
            return shown.format(budget.split(key, 1)[1].split(",")[0].rstrip(")"))
    return ""


def short_tree(label: str) -> str:
    """A tree label that fits the panel: dynamic(nodes=16, depth=8, width=4) -> dynamic(16); static as is."""
    if label.startswith("dynamic(nodes="):
        return f"dynamic({label[len('dynamic(nodes=') :].split(',')[0]})"
    return label
