"""How a row ends, the same for a lone request (core/pipeline.py) and a batched one (batch/decoder.py).

Contract: `close_step(row, events)` runs after each of the row's steps, before its events leave: it ends the
row at max_tokens, and once the row has ended it puts the detokenizer's held-back tail (the bytes of a
character the last token left unfinished) into the step's last Emitted, so the answer's text is what its
token ids decode to. `run_finished(row, collector, reason, t, peak_memory_bytes)` is the row's RunFinished:
its tokens and text from its events (metrics.py StatsCollector) with its storage's KV figures and its target
rollback's figures. Neither reads a clock, a device or a config.

Worked example (a byte-level tokenizer, max_tokens 3): the tokens say "a", then 0xE2 0x82 of a 3-byte "€";
the streaming detokenizer holds the two bytes back, so the step's Emitted says "a"; `close_step` finalizes
it and the Emitted says "a\ufffd", as `tokenizer.decode` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from specpipe.events import Emitted, Event, RunFinished
from specpipe.metrics import StatsCollector

if TYPE_CHECKING:
    from specpipe.core.row import Row


def close_step(row: Row, events: list[Event]) -> None:
    """Say the row's end after a step (max_tokens reached) and complete its text when it ended.

    Args:
        row: the core/step.py Row that just stepped.
        events: that step's events for the row, not yet sent; its last Emitted is replaced in place.
    """
    if not row.finished and len(row.output) >= row.max_tokens:
        row.finished = "max_tokens"
    if not row.finished:
        return
    row.detok.finalize()
    tail = row.detok.last_segment  # text held back for a character still incomplete
    emitted = [i for i, e in enumerate(events) if isinstance(e, Emitted)]
    if not tail or not emitted:
        return
    last = events[emitted[-1]]
    assert isinstance(last, Emitted)
    texts = list(last.token_texts)
    if texts:
        texts[-1] += tail
    events[emitted[-1]] = msgspec.structs.replace(last, text=last.text + tail, token_texts=texts)


def run_finished(row: Row, collector: StatsCollector, reason: str, t: float, peak_memory_bytes: int) -> RunFinished:
    """The row's RunFinished: its tokens, text and figures.

    Args:
        row: the finished core/step.py Row (its KV figures from its storage, core/storage.py).
        collector: the StatsCollector that consumed every event of the row.
        reason: how it ended ("eos" | "max_tokens" | "stopped" | "interrupted").
        t: seconds on the row's clock (its wall time).
        peak_memory_bytes: the device's peak while it ran (a batch shares one peak among its rows).
    """
    rollback = row.rollback  # a batched row's target rollback is the batch's mask (batch/decoder.py MaskRollback)
    stats = msgspec.structs.replace(
        collector.stats(peak_memory_bytes=peak_memory_bytes, wall_s=t),
        **row.storage.kv_figures(row),
        rollback_strategy=rollback.name,
        rollback_peak_bytes=rollback.peak_bytes,
        rollback_time_s=rollback.time_s,
        recompute_tokens=rollback.recompute_tokens,
    )
    return RunFinished(t=t, stop_reason=reason, token_ids=list(collector.token_ids), text=collector.text, stats=stats)
