"""`specpipe`: the Hydra app. Thin: preload BLAS, check the overrides,
call `runner.run(cfg)`, print the stream and a summary line.

Every user error ends as one line on stderr and a non-zero exit, never a
traceback: config errors exit 2, model/run errors exit 1, Ctrl-C exits 130,
SIGTERM 143, SIGHUP 129, a closed stdout pipe 141 (docs/faults.md).
"""

from __future__ import annotations

import sys

EXIT_CONFIG, EXIT_RUN, EXIT_INTERRUPTED = 2, 1, 130


def main() -> None:
    from specpipe import signals
    from specpipe.run_folder import claim_override

    signals.install()  # SIGTERM / SIGHUP stop a run as Ctrl-C does
    _preload_blas()
    argv = sys.argv[1:]
    if not _is_hydra_meta(argv):
        message = validate_overrides(argv) or claim_override(argv)
        if message:
            _fail(message, EXIT_CONFIG)
    import hydra

    import specpipe.config  # noqa: F401  (registers the schemas)

    hydra.main(version_base=None, config_path="pkg://specpipe.conf", config_name="config")(_task)()


def _task(cfg) -> None:
    from specpipe import signals
    from specpipe.errors import SpecpipeError
    from specpipe.runner import run

    printer = TerminalPrinter(stream=cfg.stream)
    try:
        result = run(cfg, on_event=printer)
    except SpecpipeError as exc:
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _fail(f"stopped by {signals.name()} before generation started; nothing was written", signals.exit_code())
    if result.error:  # the run folder could not be written (disk full): the line says what was kept
        _fail(result.error, EXIT_RUN)
    print(summary_line(result), file=sys.stderr)
    if result.stop_reason == "interrupted":
        sys.exit(signals.exit_code())


def validate_overrides(overrides: list[str], config_name: str = "config", tool: str = "specpipe") -> str | None:
    """Compose the config to catch bad overrides; return a one-line message or None.

    With -m / --multirun every job of the sweep is composed (Hydra would
    otherwise fail in the middle of the sweep, with its own multi-line error).
    """
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    import specpipe.config  # noqa: F401
    from specpipe.preflight import check_config, check_overrides_text

    if check_overrides_text(overrides):
        return check_overrides_text(overrides)
    multirun = any(a in ("-m", "--multirun") for a in overrides)
    plain = [o for o in overrides if not o.startswith("-") and not o.startswith("hydra.") and not o.startswith("hydra/")]
    try:
        jobs = sweep_jobs(plain) if multirun else [plain]
        with initialize_config_module(config_module="specpipe.conf", version_base=None):
            for job in jobs:
                try:
                    cfg = compose(config_name=config_name, overrides=job)
                    message = check_config(cfg)
                except (HydraException, OmegaConfBaseException) as exc:
                    message = describe_config_error(exc)
                if message:
                    where = f" (in the sweep job {' '.join(job)})" if len(jobs) > 1 else ""
                    return message.replace("`specpipe --cfg", f"`{tool} --cfg") + where
    except (HydraException, OmegaConfBaseException) as exc:  # the sweep syntax itself
        return describe_config_error(exc)
    return None


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs Hydra's basic sweeper runs for `overrides` (a=1,2 b=x,y: four jobs)."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    axes = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            key = o.get_key_element()
            axes.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            axes.append([o.input_line])
    return [list(job) for job in itertools.product(*axes)]


def describe_config_error(exc: Exception) -> str:
    """One actionable line from Hydra/OmegaConf's multi-line messages."""
    import re

    text = str(exc)
    cause = str(exc.__cause__ or "")
    missing = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        options = [o.strip() for o in text.split(f"Available options in '{group}':")[-1].split("Config search path")[0].split()]
        return f"unknown option {group}={option}: choose one of {', '.join(options)}"
    key = re.search(r"full_key: (\S+)", cause)
    if "not in" in cause and key:
        return f"unknown config key {key.group(1)!r}: check the spelling (`specpipe --cfg job` lists every key)"
    if "could not be converted" in cause and key:
        return f"{key.group(1)}: {cause.splitlines()[0]}"
    return "bad configuration: " + " ".join(text.split())


def _is_hydra_meta(argv: list[str]) -> bool:
    """Flags Hydra handles itself (help, --cfg, --info): skip pre-validation (-m sweeps are validated)."""
    return any(a in ("-h", "--help", "--hydra-help", "-c", "--cfg", "--info", "-i") or (a.startswith("--") and a != "--multirun") for a in argv)


def _fail(message: str, code: int) -> None:
    print(f"specpipe: error: {message}", file=sys.stderr)
    sys.exit(code)


def _preload_blas() -> None:
    try:
        from specpipe.engine.blas import preload_blas
    except ImportError:
        return
    info = preload_blas()
    if info.notice:
        print(f"specpipe: {info.notice}", file=sys.stderr)


class TerminalPrinter:
    """Streams generated text to stdout as Emitted events arrive."""

    def __init__(self, stream: bool = True):
        self.stream = stream

    def __call__(self, event) -> None:
        from specpipe.events import Emitted, RunFinished, RunStarted

        if isinstance(event, RunStarted):
            draft = f" + draft {event.draft.name}" if event.draft else ""
            print(f"specpipe: {event.target.name} ({event.target.precision}){draft}, drafter={event.drafter}, "
                  f"budget={event.budget}, rollback={event.rollback}", file=sys.stderr)
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


def summary_line(result) -> str:
    s = result.stats
    by = f" by {result.interrupted_by}" if getattr(result, "interrupted_by", "") else ""
    return (
        f"-- {s.generated_tokens} tokens ({result.stop_reason}{by}) | acceptance {s.acceptance_rate:.0%} "
        f"({s.accepted}/{s.drafted}) | {s.tokens_per_forward:.2f} tok/forward | {s.decode_tok_s:.1f} tok/s | "
        f"TTFT {s.ttft_s:.2f}s | p50/p99 {s.latency_ms.p50:.0f}/{s.latency_ms.p99:.0f} ms | "
        f"peak {s.peak_rss_bytes / 2**20:.0f} MiB RSS | {result.output_dir}"
    )


if __name__ == "__main__":
    main()
