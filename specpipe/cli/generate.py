"""`specpipe`: generate once and print it. Thin: `runner.run(cfg)` under the shared shell,
the stream on stdout, a header and a summary line on stderr.

Every user error ends as one line on stderr and a non-zero exit, never a traceback: config
errors exit 2, model/run errors exit 1, Ctrl-C exits 130, SIGTERM 143, SIGHUP 129, a closed
stdout pipe 141 (docs/faults.md).
"""

from __future__ import annotations

import sys

from specpipe.cli.shell import EXIT_RUN, fail, hydra_main

TOOL = "specpipe"


def main() -> None:
    hydra_main(TOOL, "config", _task, prompts=True, interrupted=" before generation started; nothing was written")


def _task(cfg) -> None:
    from specpipe import signals
    from specpipe.runner import run

    result = run(cfg, on_event=TerminalPrinter(stream=cfg.stream, progress_tokens=cfg.prefill.progress_tokens))
    if result.error:  # the run folder could not be written (disk full): the line says what was kept
        fail(TOOL, result.error, EXIT_RUN)
    print(summary_line(result), file=sys.stderr)
    if result.stop_reason == "interrupted":
        sys.exit(signals.exit_code())


class TerminalPrinter:
    """Streams generated text to stdout as Emitted events arrive."""

    def __init__(self, stream: bool = True, progress_tokens: int = 2048):
        self.stream = stream
        self.progress = PrefillBar(progress_tokens)

    def __call__(self, event) -> None:
        from specpipe.engine.load.blas import blas_info, blas_phrase
        from specpipe.events import Emitted, RunFinished, RunStarted

        self.progress(event)
        if isinstance(event, RunStarted):
            draft = f" + draft {event.draft.name}" if event.draft else ""
            if event.draft_head_rows is not None:  # draft.vocab: say that the draft's head is cut, and to what
                draft += f" (head cut to {event.draft_head_rows} rows + the context's)"
            print(
                f"specpipe: {event.target.name} ({event.target.precision}){draft}, drafter={event.drafter}, "
                f"budget={event.budget}, rollback={event.rollback}, {blas_phrase(blas_info())}",
                file=sys.stderr,
            )
        elif isinstance(event, Emitted) and self.stream:
            self._write(event.text)
        elif isinstance(event, RunFinished):
            self._write(("" if self.stream else event.text) + "\n")

    @staticmethod
    def _write(text: str) -> None:
        from specpipe import signals

        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:  # `specpipe ... | head`: the reader left; stop as a signal would, keeping the run
            signals.note_broken_pipe()
            raise KeyboardInterrupt from None


class PrefillBar:
    """One progress line on stderr while a long prompt is read (terminals only; prompts of at least
    `min_tokens`), rewritten in place from PrefillProgress events and closed by PrefillDone."""

    WIDTH = 30

    def __init__(self, min_tokens: int, stream=None):
        self.min_tokens, self.stream = min_tokens, stream
        self.shown = False
        self.t0 = 0.0

    def __call__(self, event) -> None:
        from specpipe.events import PrefillDone, PrefillProgress, RunStarted

        out = self.stream or sys.stderr
        if isinstance(event, RunStarted):
            self.t0 = event.t
        elif isinstance(event, PrefillProgress) and event.total >= self.min_tokens and out.isatty():
            filled = self.WIDTH * event.tokens // max(event.total, 1)
            rate = event.tokens / max(event.t - self.t0, 1e-9)
            out.write(
                f"\rprefill [{'#' * filled}{'.' * (self.WIDTH - filled)}] {event.tokens}/{event.total} tokens, "
                f"{rate:.0f} tok/s"
            )
            out.flush()
            self.shown = True
        elif isinstance(event, PrefillDone) and self.shown:
            out.write("\n")
            out.flush()
            self.shown = False


def summary_line(result) -> str:
    s = result.stats
    by = f" by {result.interrupted_by}" if getattr(result, "interrupted_by", "") else ""
    return (
        f"-- {s.generated_tokens} tokens ({result.stop_reason}{by}) | acceptance {s.acceptance_rate:.0%} "
        f"({s.accepted}/{s.drafted}) | {s.tokens_per_forward:.2f} tok/forward | {s.decode_tok_s:.1f} tok/s | "
        f"TTFT {s.ttft_s:.2f}s | prefill {s.prefill_tok_s:.0f} tok/s ({s.prompt_tokens} tokens{_draft_prefill(s)}) | "
        f"KV {s.kv_bytes_per_token / 1024:.1f} KiB/token | p50/p99 {s.latency_ms.p50:.0f}/{s.latency_ms.p99:.0f} ms | "
        f"peak {s.peak_rss_bytes / 2**20:.0f} MiB RSS | {result.output_dir}"
    )


def _draft_prefill(s) -> str:
    return f", drafter {s.draft_prefill_s:.2f}s" if s.draft_prefill_s >= 0.005 else ""  # a draft model's own prefill


if __name__ == "__main__":
    main()
