"""Prefill: chunked by `prefill.chunk` with the same cache as one forward,
progress events for prompts longer than a chunk, the target's and the
draft model's prefill timed apart, and the CLI's bar drawn only on a terminal."""

from __future__ import annotations

import io

import mlx.core as mx
from conftest import generate, make_drafter, noisy_copy, tiny

from specpipe.cli.generate import PrefillBar, summary_line
from specpipe.events import DraftPrefilled, PrefillDone, PrefillProgress, RunStarted


def test_chunk_size_changes_nothing_but_the_events():
    target = tiny("qwen2")
    prompt = [3 + i % 200 for i in range(100)]
    runs = {}
    for chunk in (7, 512):
        target.prefill_chunk = chunk
        ids, final, events, pipe = generate(target, make_drafter("ngram", target), 4, prompt, 12)
        runs[chunk] = ids, [e for e in events if isinstance(e, PrefillProgress)], pipe.cache
    assert runs[7][0] == runs[512][0]
    assert [e.tokens for e in runs[7][1]] == [7 * i for i in range(1, 15)] + [99]
    assert all(e.total == 99 for e in runs[7][1]) and runs[512][1] == []  # one chunk: no progress to show
    assert mx.allclose(runs[7][2][0].keys[..., :99, :], runs[512][2][0].keys[..., :99, :], atol=1e-5).item()


def test_draft_model_prefill_is_timed_apart():
    """The target's prefill gives the first token; the draft model prefills after it (DraftPrefilled), so
    the first token waits on the target alone, and the draft's seconds count as prefill, not decoding."""
    target = tiny("llama")
    prompt = [3 + i % 200 for i in range(300)]
    _, final, events, _ = generate(target, make_drafter("model", target, noisy_copy(target, 0.5)), 4, prompt, 4)
    done = next(e for e in events if isinstance(e, PrefillDone))
    deferred = next(e for e in events if isinstance(e, DraftPrefilled))
    assert done.target_seconds > 0 and done.draft_seconds == 0
    assert deferred.seconds > 0 and deferred.tokens >= len(prompt)
    assert events.index(deferred) > events.index(done)
    s = final.stats
    assert s.draft_prefill_s == deferred.seconds and s.prefill_s == done.seconds
    assert abs(s.prefill_tok_s - s.prompt_tokens / done.target_seconds) < 1e-6 * s.prefill_tok_s


class Tty(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def feed(bar: PrefillBar, total: int) -> None:
    bar(_started())
    for done in range(512, total, 512):
        bar(PrefillProgress(t=0.1, tokens=done, total=total))
    bar(PrefillProgress(t=0.2, tokens=total, total=total))
    bar(PrefillDone(t=0.3, tokens=total + 1, seconds=0.3))


def _started() -> RunStarted:
    from specpipe.events import ModelInfo

    return RunStarted(
        target=ModelInfo(name="m", source="tiny-random", arch="llama", precision="float32"),
        drafter="ngram",
        budget="fixed",
        rollback="trim",
        max_tokens=4,
    )


def test_bar_only_on_a_terminal_and_only_for_long_prompts():
    shown = Tty(True)
    feed(PrefillBar(2048, stream=shown), 4096)
    lines = shown.getvalue()
    assert lines.count("\r") == 8 and lines.endswith("4096/4096 tokens, 20480 tok/s\n")
    for stream, total in ((Tty(False), 4096), (Tty(True), 1024)):
        feed(PrefillBar(2048, stream=stream), total)
        assert stream.getvalue() == ""


def test_summary_line_shows_prefill_and_kv():
    target = tiny("llama")
    _, final, _, _ = generate(target, make_drafter("none", target), 1, [5] * 40, 3)

    class Result:
        stats, stop_reason, output_dir = final.stats, final.stop_reason, "out"

    line = summary_line(Result())
    assert f"prefill {final.stats.prefill_tok_s:.0f} tok/s (40 tokens)" in line and "KiB/token" in line
