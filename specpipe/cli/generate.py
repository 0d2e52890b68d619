"""`specpipe`: generate once and print it. Thin: `runner.run(cfg)` under the shared shell,
the stream on stdout, a header and a summary line on stderr.

Every user error ends as one line on stderr and a non-zero exit, never a traceback: config
errors exit 2, model/run errors exit 1, Ctrl-C exits 130, SIGTERM 143, SIGHUP 129, a closed
stdout pipe 141, any other failed stdout write (a full disk, an I/O error) 74 (docs/faults.md).
A stdout that fails, even after the last token (`stream=false ... | true`), ends the run the
way a stop does: the run folder keeps everything, and the exit code says the text was lost.
"""

from __future__ import annotations

import sys

TOOL = "specpipe"


def main() -> None:
    from specpipe.run import signals

    signals.install()  # first: a Ctrl-C while the rest imports is one line too (hydra_main installs it again)
    interrupted = " before generation started; nothing was written"
    try:
        from specpipe.cli.shell import hydra_main
    except KeyboardInterrupt:
        print(f"{TOOL}: error: stopped by {signals.name()}{interrupted}", file=sys.stderr)
        sys.exit(signals.exit_code())
    hydra_main(TOOL, "config", _task, prompts=True, interrupted=interrupted)
    from specpipe.cli.sweep_table import table

    if table():  # a sweep (-m) ends with its jobs side by side, after Hydra's and each job's own lines
        say(table())


def _task(cfg) -> None:
    from specpipe.cli.shell import EXIT_RUN, fail
    from specpipe.run import signals
    from specpipe.run.runner import run

    # the answer shows under the prompt it answers when the user did not type one (the README's first run)
    shown = None if _prompt_typed() else (_prompt_choice(), str(cfg.prompt.text))
    printer = TerminalPrinter(stream=cfg.stream, progress_tokens=cfg.prefill.progress_tokens, default_prompt=shown)
    result = run(cfg, on_event=printer)
    if result.error:  # the run folder could not be written (disk full): the line says what was kept
        fail(TOOL, result.error, EXIT_RUN)
    say(summary_line(result))
    _record_sweep_job(result)
    if result.stop_reason == "interrupted" or signals.stdout_lost():
        sys.exit(signals.exit_code())


def _prompt_typed() -> bool:
    """The user named the prompt (positional text, --prompt, -, prompt.file=, prompt.text= or prompt=NAME)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return True
    keys = {o.split("=", 1)[0].lstrip("+") for o in HydraConfig.get().overrides.task}
    return bool(keys & {"prompt", "prompt.text"})


def _prompt_choice() -> str:
    from hydra.core.hydra_config import HydraConfig

    return str(HydraConfig.get().runtime.choices.get("prompt", "code-edit"))


def _record_sweep_job(result) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from specpipe.cli import sweep_table

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        sweep_table.record(list(HydraConfig.get().overrides.task), result)


def say(line: str) -> None:
    """A line on stderr, if stderr can still be written: a closed or full stderr must not cost the run."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class TerminalPrinter:
    """Streams generated text to stdout as Emitted events arrive."""

    def __init__(self, stream: bool = True, progress_tokens: int = 2048, default_prompt: tuple[str, str] | None = None):
        self.stream = stream
        self.progress = PrefillBar(progress_tokens)
        self.default_prompt = default_prompt  # (its prompt= name, its text): shown above the answer

    def __call__(self, event) -> None:
        from specpipe.engine.load.blas import blas_info, blas_phrase
        from specpipe.events import Emitted, RunFinished, RunStarted

        self.progress(event)
        if isinstance(event, RunStarted):
            draft = f" + draft {event.draft.name}" if event.draft else ""
            if event.draft_head_rows is not None:  # draft.vocab: say that the draft's head is cut, and to what
                draft += f" (head cut to {event.draft_head_rows} rows + the context's)"
            if event.draft_vocab_map:  # another tokenizer: say how its drafts reach the target's ids
                draft += f" (vocab_map={event.draft_vocab_map}, {event.draft_vocab_shared} tokens shared)"
            budget = f"budget={event.budget}, " if event.drafter != "none" else ""  # plain decoding has no K
            say(
                f"specpipe: {event.target.name} ({event.target.precision}){draft}, drafter={event.drafter}, "
                f"{budget}rollback={event.rollback}, {blas_phrase(blas_info())}"
            )
            for warning in event.warnings:  # a setting predicted slower than plain (specpipe/advice.py)
                say(f"specpipe: warning: {warning}")
            if self.default_prompt:
                name, text = self.default_prompt
                say(f'specpipe: the default prompt (prompt={name}; give yours as specpipe "..."):')
                say("\n".join(f"  | {line}".rstrip() for line in text.splitlines()))
        elif isinstance(event, Emitted) and self.stream:
            self._write(event.text)
        elif isinstance(event, RunFinished):
            self._write(("" if self.stream else event.text) + "\n")

    @staticmethod
    def _write(text: str) -> None:
        from specpipe.run import signals

        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError as exc:  # `| head` left (EPIPE), `> /dev/full` (ENOSPC), EIO: stop as a signal would
            signals.note_stdout_lost(exc)
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
        try:
            self._show(event, self.stream or sys.stderr)
        except (OSError, ValueError):  # a stderr that cannot be written only loses the bar
            pass

    def _show(self, event, out) -> None:
        from specpipe.events import PrefillDone, PrefillProgress, RunStarted

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
    by = getattr(result, "interrupted_by", "")
    if by:  # a stdout that failed after the last token (stream=false | true) cut only the output
        by = f" by {by}" if result.stop_reason == "interrupted" else f", output cut by {by}"
    plain = getattr(result, "drafter", "") == "none"  # draft=none drafts nothing: no acceptance to state
    acceptance = "" if plain else f" | acceptance {s.acceptance_rate:.0%} ({s.accepted}/{s.drafted}{_sources(s)})"
    prompt = f"{s.prompt_tokens} tokens{_cached(s)}{_draft_prefill(s)}"
    return (
        f"-- {s.generated_tokens} tokens ({result.stop_reason}{by}){acceptance} | "
        f"{s.tokens_per_forward:.2f} tok/forward | {s.decode_tok_s:.1f} tok/s | "
        f"TTFT {s.ttft_s:.2f}s | prefill {s.prefill_tok_s:.0f} tok/s ({prompt}) | "
        f"KV {s.kv_bytes_per_token / 1024:.1f} KiB/token | p50/p99 {s.latency_ms.p50:.0f}/{s.latency_ms.p99:.0f} ms | "
        f"peak {s.peak_rss_bytes / 2**20:.0f} MiB RSS{_chosen(s)}{_worth(result)} | {result.output_dir}"
    )


def _worth(result) -> str:
    """The cost model's estimate against plain decoding (costmodel/worth.py), the whole request's first and the
    decoding's beside it; nothing when it has no costs."""
    from specpipe.costmodel.worth import phrase

    words = phrase(*(getattr(result, f"speedup_{k}", 0.0) for k in ("estimate", "low", "high")))
    if not words:
        return ""
    whole, low, high = (getattr(result, f"speedup_e2e_{k}", 0.0) for k in ("estimate", "low", "high"))
    if whole <= 0:
        return f" | {words}"
    span = f" ({low:.1f}-{high:.1f})" if low > 0 and high > 0 else ""
    return f" | ~{whole:.1f}x{span} end to end, decoding {words}"


def _sources(s) -> str:
    """Accepted / drafted per source (draft=chain's sources; draft=suffix's history and context)."""
    by = s.drafted_by_source
    return "; " + ", ".join(f"{name} {s.accepted_by_source.get(name, 0)}/{n}" for name, n in by.items()) if by else ""


def _chosen(s) -> str:
    """budget=auto's choice of the draft model's prefill with its predicted figures (RunStats.draft_prefill)."""
    return f" | {s.draft_prefill}" if getattr(s, "draft_prefill", "") else ""


def _cached(s) -> str:
    """How much of the prompt the prefix store held (prefix_cache): those tokens took no prefill."""
    return f", {s.cached_tokens} from the prefix store" if s.cached_tokens else ""


def _draft_prefill(s) -> str:
    return f", drafter {s.draft_prefill_s:.2f}s" if s.draft_prefill_s >= 0.005 else ""  # a draft model's own prefill


if __name__ == "__main__":
    main()
