"""Typed events: the only thing consumers (terminal, TUI, benchmark) see.

The pipeline yields one event per thing that happens; `events.jsonl` is these
events, one JSON object per line, tagged by `kind`. New fields get defaults
so old recordings stay readable. Nothing here imports mlx.
"""

from __future__ import annotations

import os

import msgspec

from specpipe.engine.info import ModelInfo  # what was loaded; defined beside the engine, carried by RunStarted


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


class Base(msgspec.Struct, tag_field="kind", tag=_snake, frozen=True, kw_only=True):
    """Common fields: `t` is seconds since the run started (after loading)."""

    t: float = 0.0


class RunStarted(Base, frozen=True, kw_only=True):  # frozen restated: mypy reads each class alone
    target: ModelInfo
    draft: ModelInfo | None = None
    drafter: str  # "ngram" | "model" | "none" | ...
    budget: str
    rollback: str
    compare: str = "greedy"
    seed: int = 0
    prompt_text: str = ""
    prompt_ids: list[int] = []
    max_tokens: int
    config_yaml: str = ""
    tree: str = ""  # tree != chain: the shape, e.g. "dynamic(nodes=16, depth=8, width=4)"; "" for a chain
    # rows of the draft model's LM head every drafted token scores (draft.vocab; the context's ids join
    # them during the run); None: every row, or no draft model
    draft_head_rows: int | None = None
    # a draft model with another tokenizer drafts through a token map (draft.vocab_map): "intersection" or
    # "text", and the ids both vocabularies share; "" and None: the target's own tokenizer
    draft_vocab_map: str = ""
    draft_vocab_shared: int | None = None
    # settings the cost model predicts slower than plain decoding, one line each (specpipe/advice.py)
    warnings: list[str] = []
    # the costs the "vs plain" estimate prices steps with (costmodel/worth.py calibrated_costs): T(n)/T(1)
    # and the draft's cost per token; None: unknown, the estimate times the run's own plain steps instead
    verify_ratio: dict[int, float] | None = None
    draft_cost: float | None = None


class PrefillProgress(Base, frozen=True, kw_only=True):
    """A prompt longer than one prefill chunk: `tokens` of `total` are in the target cache."""

    tokens: int
    total: int


class PrefillDone(Base, frozen=True, kw_only=True):  # frozen restated: mypy reads each class alone
    """The prompt is in every cache. `seconds` is the whole prefill (the part of TTFT before the
    first step); `target_seconds` and `draft_seconds` split it between the target's cache and the
    drafter's (a draft model's own prefill). Recordings made before the split have 0.0 there."""

    tokens: int
    seconds: float
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    cached_tokens: int = 0  # of `tokens`, the leading ones taken from the prefix store (not prefilled)


class DraftPrefilled(Base, frozen=True, kw_only=True):  # frozen restated: mypy reads each class alone
    """A draft model read the prompt after the target's first token was out: its prefill waits for it, so the
    first token comes as fast as plain decoding's. `tokens`: the prompt tokens it fed the draft model (the
    context but its newest token for the whole prompt, sinks + window under a window, 0 where it read none;
    one chunk per event under a chunked prefill, which yields one event per step until it caught up). Like the
    prefill it is, `seconds` counts in the run's draft prefill, not in decode tok/s; a reader sees it as the
    wait for the next step's tokens."""

    tokens: int
    seconds: float


class BudgetDecision(msgspec.Struct, frozen=True, kw_only=True):
    """Why a budget chose this step's K (budget=auto): what a user needs to see it reason.

    reason: "cost model" (K maximised the predicted speed-up), "probe" (a short
    draft bought on thin evidence or on the probe schedule; `predicted` is then
    the cost model's figure for that K), "plain" (no K beats plain decoding),
    "override" (RunControl set K), "short answer" (a probe the answer's expected
    remaining tokens could not repay), "no draft prefill" (this request's draft
    model reads nothing: free drafts only), "draft catching up" (a chunked
    draft prefill is still behind the context: free drafts only, whatever K the
    budget chose), "cap" (a free drafter that classifies its
    drafts may propose up to K; found nothing to propose), "first token" (a
    plain first step, its token as soon as plain decoding's: budget=auto's
    every run, and a draft model's, which prefills after it: DraftPrefilled).
    evidence: the class of the draft in hand when K was fitted to it (n-gram:
    the matched suffix length); the rates are then that class's.
    floor: a model drafter stops before K at a token whose chain is estimated
    to hold with less than this chance (0: it drafts all K; drafters/chain.py
    ChainStop, whose hold rates the Drafted event does not repeat).
    context_curve: where t_verify came from at a long context (below).
    """

    k: int
    reason: str
    predicted: float = 1.0  # expected speed-up of K over plain decoding, by the cost model
    alpha: float = 0.0  # P(first drafted token accepted) it used
    continuation: float = 0.0  # P(next accepted | previous accepted) it used
    c: float = 0.0  # one drafted token's cost, in target steps, it used
    t_verify: float = 0.0  # T(K+1)/T(1) it used
    evidence: int | None = None
    floor: float = 0.0
    # how t_verify was priced past the short-context calibration: "timed" (curves specpipe-calibrate cached
    # at long contexts), "modelled" (none cached yet: the short curve and a context-length model, no timing
    # on the request's path), "" (a cache shorter than 512 positions: the short-context calibration itself)
    context_curve: str = ""
    # the request's first plan only: how the draft model prepares (budgets/prefill_price.py), with each
    # option's predicted net saving: "draft prefill window 256 (net +3.1 steps; none +0.0, full -40.2) ..."
    prefill: str = ""


class Drafted(Base, frozen=True, kw_only=True):  # frozen restated: mypy reads each class alone
    """A drafter proposed `draft_ids` for this step (may be fewer than k).

    With K = 0, budget=auto may instead look back: `hindsight_ids` is what the
    drafter would have proposed for the step's last emitted tokens, of which
    the first `hindsight_matched` equal what the target chose (no verify).

    Draft forwards this step, by purpose (model-running drafters; 0 for n-gram):
    `forwards` in all = `draft_forwards` (each produced a token the target
    verifies; on a probe step they are probe forwards) + `catchup_forwards`
    (only fed accepted context tokens) + `hindsight_forwards` (guesses for
    emitted tokens) + `wasted_forwards` (a token computed but not proposed,
    e.g. a confidence stop). Catch-up normally rides in the first drafting
    forward, so it costs no forward of its own; `catchup_tokens` counts the
    context tokens that forward fed.
    """

    step: int
    k: int
    draft_ids: list[int]
    seconds: float
    hindsight_ids: list[int] = []
    hindsight_matched: int = 0
    forwards: int = 0
    draft_forwards: int = 0
    catchup_forwards: int = 0
    catchup_tokens: int = 0
    hindsight_forwards: int = 0
    wasted_forwards: int = 0
    probe: bool = False
    decision: BudgetDecision | None = None
    tree_parents: list[int] = []  # tree != chain: parent node of each draft_ids entry (-1: the root); [] for a chain
    source: str = ""  # draft=chain: the source that drafted (ngram, model, ...); draft=suffix: history | context


class Verified(Base, frozen=True, kw_only=True):  # frozen restated: mypy reads each class alone
    """One target forward scored the draft; the comparator's verdict.

    Exactly one of `recovered_id` (target token at the first rejection) and
    `bonus_id` (target token after a fully accepted draft) is set.
    """

    step: int
    accepted_ids: list[int]
    rejected_ids: list[int]
    recovered_id: int | None = None
    bonus_id: int | None = None
    seconds: float
    rejected_text: str = ""  # the rejected draft decoded, for display only
    overlap: list[float] = []  # Σ min(p, q) per draft position (sampling rules only)
    accepted_path: list[
        int
    ] = []  # tree != chain: accepted node indices into the step's draft_ids; rejected_ids = the other nodes
    tree_depth: int = 0  # tree != chain: depth of the verified tree (acceptance by position counts depths)


class RolledBack(Base, frozen=True, kw_only=True):  # frozen restated: mypy reads each class alone
    """Caches were brought back to the accepted length."""

    step: int
    strategy: str
    target_dropped: int
    draft_dropped: int
    seconds: float


class Emitted(Base, frozen=True, kw_only=True):  # frozen restated: mypy reads each class alone
    """Tokens appended to the output (accepted + recovered/bonus, cut at stop)."""

    step: int
    token_ids: list[int]
    text: str
    from_draft: int  # how many of token_ids came from the draft (the rest from the target)
    token_texts: list[str] = []  # text piece per token (streaming detokenizer); joins to `text`


class LatencyStats(msgspec.Struct, frozen=True, kw_only=True):
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0


class RunStats(msgspec.Struct, frozen=True, kw_only=True):
    """Figures of one run; see metrics.py for the definitions."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens taken from the prefix store instead of prefilled (prefix_cache)
    generated_tokens: int = 0
    steps: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0
    acceptance_length: float = 0.0
    acceptance_by_position: list[float] = []  # acceptance rate at draft positions 1..K
    expected_acceptance: float = 0.0  # mean Σ min(p, q) over verified positions (sampling only)
    tokens_per_forward: float = 0.0
    prefill_tok_s: float = 0.0  # prompt tokens / the target's prefill seconds (the draft model's prefill apart)
    prefill_s: float = 0.0  # the whole prefill: target + drafter
    draft_prefill_s: float = 0.0  # the drafter's share of prefill_s (a draft model's own cache)
    # seconds the drafter spent proposing while decoding (Drafted.seconds summed): over `drafted`, a draft's
    # cost per token; over plain decoding's seconds per token, the c that budget=auto prices
    draft_s: float = 0.0
    kv_bytes: int = 0  # the target's KV cache at the end of the run (kv=full | quantized | window)
    kv_bytes_per_token: float = 0.0  # kv_bytes / positions in that cache
    decode_tok_s: float = 0.0
    ttft_s: float = 0.0
    wall_s: float = 0.0
    latency_ms: LatencyStats = LatencyStats()
    peak_memory_bytes: int = 0
    peak_rss_bytes: int = 0
    rollback_strategy: str = ""
    rollback_peak_bytes: int = 0  # memory held for recurrent-state snapshots
    rollback_time_s: float = 0.0  # time spent rolling back (restores, recomputes)
    recompute_tokens: int = 0  # tokens re-run through a model by rollback=recompute
    hindsight_checked: int = 0  # tokens budget=auto checked in hindsight while K = 0 (no verify)
    hindsight_matched: int = 0
    # draft forwards of this run by purpose (see Drafted); draft_forwards is their sum
    draft_forwards_drafting: int = 0  # produced a token the target verified (probes excluded)
    draft_forwards_probe: int = 0  # drafting forwards on probe steps
    draft_forwards_catchup: int = 0  # fed accepted context only
    draft_forwards_hindsight: int = 0
    draft_forwards_wasted: int = 0  # produced nothing the target verified
    probe_steps: int = 0
    tree_steps: int = 0  # steps that verified a non-empty token tree (tree != chain)
    tree_nodes_per_step: float = 0.0  # mean draft nodes verified per tree step
    tree_path_length: float = 0.0  # mean accepted path length per tree step (bonus excluded)
    # draft=chain: per source that drafted (Drafted.source), its verified drafted tokens and the accepted ones
    drafted_by_source: dict[str, int] = {}
    accepted_by_source: dict[str, int] = {}
    # budget=auto's choice of the draft model's prefill for this request, with its predicted figures
    # (BudgetDecision.prefill); "" where nothing was chosen
    draft_prefill: str = ""


class RunFinished(Base, frozen=True, kw_only=True):  # frozen restated: mypy reads each class alone
    stop_reason: str  # "eos" | "max_tokens" | "stopped" (RunControl) | "interrupted" (Ctrl-C) | "error"
    token_ids: list[int]
    text: str
    stats: RunStats


class RunError(Base, frozen=True, kw_only=True):  # frozen restated: mypy reads each class alone
    message: str


Event = (
    RunStarted
    | PrefillProgress
    | PrefillDone
    | DraftPrefilled
    | Drafted
    | Verified
    | RolledBack
    | Emitted
    | RunFinished
    | RunError
)

EVENT_TYPES = (
    RunStarted,
    PrefillProgress,
    PrefillDone,
    DraftPrefilled,
    Drafted,
    Verified,
    RolledBack,
    Emitted,
    RunFinished,
    RunError,
)


class EventWriter:
    """Appends events to a JSONL file, one encoder reused for every line.

    Each line reaches the file whole as it is written (no buffer held back),
    so a crash keeps every event before it. A failed write (disk full) cuts
    the file back to its last whole line and raises the OSError; the writer
    then refuses further lines (`failed` holds the error).
    """

    def __init__(self, path):
        self._file = open(path, "wb", buffering=0)
        self._encoder = msgspec.json.Encoder()
        self._buffer = bytearray()
        self._good = 0  # bytes of whole lines on disk
        self.lines = 0
        self.failed: OSError | None = None

    def write(self, event: Event) -> None:
        if self.failed is not None:
            raise self.failed
        self._encoder.encode_into(event, self._buffer)
        self._buffer.extend(b"\n")
        view = memoryview(self._buffer)
        try:
            while view:  # a raw write may be short: loop until the whole line is down
                view = view[self._file.write(view) :]
        except OSError as exc:
            self.failed = exc
            try:
                os.ftruncate(self._file.fileno(), self._good)
            except OSError:
                pass
            raise
        finally:
            view.release()
        self._good += len(self._buffer)
        self.lines += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_events(path) -> list[Event]:
    """Decode a recorded `events.jsonl` (every line must be whole)."""
    with open(path, "rb") as f:
        return msgspec.json.Decoder(Event).decode_lines(f.read())


def read_recording(path) -> tuple[list[Event], str | None]:
    """Decode `events.jsonl` as a crash may have left it: a torn last line (no newline,
    not valid JSON) is skipped. Returns the events and a notice when one was skipped;
    a bad line anywhere else still raises msgspec.DecodeError / ValidationError."""
    with open(path, "rb") as f:
        data = f.read()
    decoder = msgspec.json.Decoder(Event)
    if data and not data.endswith(b"\n"):
        head, _, tail = data.rpartition(b"\n")
        events = decoder.decode_lines(head + b"\n" if head else b"")
        try:
            return events + decoder.decode_lines(tail), None
        except (msgspec.DecodeError, msgspec.ValidationError):
            return events, (
                f"skipped a torn last line in {path} ({len(tail)} bytes: the run was cut off "
                f"while writing it); replaying the {len(events)} whole events before it"
            )
    return decoder.decode_lines(data), None
