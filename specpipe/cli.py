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

    signals.install()  # SIGTERM / SIGHUP stop a run as Ctrl-C does
    _preload_blas()
    prepare_argv("config", "specpipe")
    import hydra

    import specpipe.config  # noqa: F401  (registers the schemas)

    hydra.main(version_base=None, config_path="pkg://specpipe.conf", config_name="config")(_task)()


def _task(cfg) -> None:
    _preload_blas()  # a launcher (joblib, submitit) runs jobs in fresh processes that skipped main()
    from specpipe import signals
    from specpipe.errors import SpecpipeError
    from specpipe.runner import run

    printer = TerminalPrinter(stream=cfg.stream, progress_tokens=cfg.prefill.progress_tokens)
    try:
        result = run(cfg, on_event=printer)
    except SpecpipeError as exc:
        _drop_empty_run_folder()
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _drop_empty_run_folder()
        _fail(f"stopped by {signals.name()} before generation started; nothing was written", signals.exit_code())
    if result.error:  # the run folder could not be written (disk full): the line says what was kept
        _fail(result.error, EXIT_RUN)
    print(summary_line(result), file=sys.stderr)
    if result.stop_reason == "interrupted":
        sys.exit(signals.exit_code())


def _drop_empty_run_folder() -> None:
    """Hydra makes the run folder before the task; a run that failed before generating anything
    leaves nothing worth keeping there (only Hydra's own .hydra/ snapshot), so remove it."""
    import shutil
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    try:
        folder = Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # not under Hydra (run() called directly)
        return
    if not folder.is_dir():
        return
    leftovers = [p for p in folder.iterdir() if p.name != ".hydra" and not (p.suffix == ".log" and p.stat().st_size == 0)]
    if not leftovers:
        shutil.rmtree(folder, ignore_errors=True)
        for parent in (folder.parent, folder.parent.parent):  # the date folder, then outputs/, if now empty
            try:
                parent.rmdir()
            except OSError:
                break


def prepare_argv(config_name: str, tool: str, prompts: bool = True) -> list[str]:
    """Read sys.argv as Hydra will, after the prompt forms (specpipe/prompt_args.py) and
    `--rerun RUN_DIR` are turned into Hydra's own arguments; exit with one line on bad input.

    Sets sys.argv to what Hydra should parse and returns the arguments after the program name.
    """
    from specpipe.prompt_args import PromptArgError, expand_prompt_args

    argv = sys.argv[1:]
    try:
        argv = rerun_args(argv)
        if prompts:
            argv = expand_prompt_args(argv)
    except (PromptArgError, ValueError) as exc:
        _fail(str(exc), EXIT_CONFIG, tool)
    argv = _flags_first(argv)
    sys.argv = sys.argv[:1] + argv
    modes = [a for a in argv if a.partition("=")[0] in ("-m", "--multirun", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion")]
    if len(modes) > 1:  # Hydra's own check raises a traceback
        _fail(f"{' and '.join(modes)} cannot be combined: Hydra does one of them (drop -m to print one job's config)",
              EXIT_CONFIG, tool)
    if not _is_hydra_meta(argv):
        config_dir = _flag_value(argv, "-cp", "--config-path")
        name = _flag_value(argv, "-cn", "--config-name") or config_name
        from specpipe.run_folder import claim_override

        message = validate_overrides(argv, name, tool, config_dir=config_dir) or claim_override(argv)
        if message:
            _fail(message, EXIT_CONFIG, tool)
    return argv


def rerun_args(argv: list[str]) -> list[str]:
    """`--rerun RUN_DIR` (a run folder, or its .hydra/) -> Hydra's `-cp RUN_DIR/.hydra -cn config`.

    The run's composed config.yaml becomes the primary config, so the re-run uses exactly the
    values the run used (prompt text included) even if specpipe's defaults changed since; more
    overrides may follow. `--config-dir DIR` naming such a snapshot folder is read the same way
    (Hydra would otherwise find specpipe's own config.yaml first and silently run the defaults).
    Relative -cp folders are made absolute (Hydra reads them relative to its own module).
    """
    import os

    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--rerun", "--config-dir", "-cd", "-cp", "--config-path"):
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{name} needs a folder, e.g. {name} outputs/2026-11-30/12-00-00")
                value, i = argv[i + 1], i + 1
            folder = os.path.abspath(value)
            if name == "--rerun" and os.path.isdir(os.path.join(folder, ".hydra")):
                folder = os.path.join(folder, ".hydra")
            snapshot = os.path.isfile(os.path.join(folder, "config.yaml")) and os.path.isfile(os.path.join(folder, "overrides.yaml"))
            if name == "--rerun" and not snapshot:
                raise ValueError(f"{value} is not a run folder (no .hydra/config.yaml): give a folder under outputs/")
            if name in ("-cp", "--config-path") or snapshot:
                out += ["-cp", folder] + ([] if snapshot is False or _flag_value(argv, "-cn", "--config-name") else ["-cn", "config"])
            else:
                out += [name, folder]
        else:
            out.append(arg)
        i += 1
    return out


def _flag_value(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in names:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def validate_overrides(overrides: list[str], config_name: str = "config", tool: str = "specpipe",
                       config_dir: str | None = None) -> str | None:
    """Compose the config to catch bad overrides; return a one-line message or None.

    With -m / --multirun every job of the sweep is composed (Hydra would
    otherwise fail in the middle of the sweep, with its own multi-line error).
    `config_dir`: a folder of configs (a run's .hydra/ snapshot) instead of specpipe's own.
    """
    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    import specpipe.config  # noqa: F401
    from specpipe.preflight import check_config, check_overrides_text

    if check_overrides_text(overrides):
        return check_overrides_text(overrides)
    multirun = any(a in ("-m", "--multirun") for a in overrides)
    plain = [o for o in _overrides_only(overrides) if not o.startswith("hydra.") and not o.startswith("hydra/")]
    init = (initialize_config_dir(config_dir=config_dir, version_base=None) if config_dir
            else initialize_config_module(config_module="specpipe.conf", version_base=None))
    try:
        jobs = sweep_jobs(plain) if multirun else [plain]
        with init:
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




def _flags_first(argv: list[str]) -> list[str]:
    """Hydra's flags (with their values) before the overrides: Hydra's argparse rejects overrides
    that follow a flag (`a=1 -m b=2` fails with "unrecognized arguments: b=2")."""
    from specpipe.prompt_args import FLAGS_WITH_VALUE, INFO_VALUES

    flags, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            flags.append(arg)
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and not nxt.startswith("-") and "=" not in arg and (
                    arg in FLAGS_WITH_VALUE or (arg in ("-i", "--info") and nxt in INFO_VALUES)):
                flags.append(nxt)
                i += 1
        else:
            overrides.append(arg)
        i += 1
    return flags + overrides


def _overrides_only(argv: list[str]) -> list[str]:
    """argv without Hydra's flags and their values (`-cp DIR`, `-cn NAME`, `-m`)."""
    from specpipe.prompt_args import FLAGS_WITH_VALUE

    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in FLAGS_WITH_VALUE:
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


def _is_hydra_meta(argv: list[str]) -> bool:
    """Flags Hydra handles itself (help, --cfg, --info, shell completion): skip pre-validation.

    -m sweeps and -cp / -cn / --config-dir runs are validated.
    """
    meta = ("-h", "--help", "--hydra-help", "-c", "--cfg", "--info", "-i", "-sc", "--shell-completion",
            "--resolve", "--version")
    own = ("--multirun", "--config-path", "--config-name", "--config-dir")
    return any(a.partition("=")[0] in meta or (a.startswith("--") and a.partition("=")[0] not in own) for a in argv)


def _fail(message: str, code: int, tool: str = "specpipe") -> None:
    print(f"{tool}: error: {message}", file=sys.stderr)
    sys.exit(code)


def _preload_blas() -> None:
    """Load the fastest BLAS before anything imports MLX. Says nothing here: which BLAS is in use
    (and how to get a fast one) is part of the run's header line, so a bad-input error stays one line."""
    try:
        from specpipe.engine.blas import preload_blas
    except ImportError:
        return
    preload_blas()


class TerminalPrinter:
    """Streams generated text to stdout as Emitted events arrive."""

    def __init__(self, stream: bool = True, progress_tokens: int = 2048):
        self.stream = stream
        self.progress = PrefillBar(progress_tokens)

    def __call__(self, event) -> None:
        from specpipe.engine.blas import blas_info, blas_phrase
        from specpipe.events import Emitted, RunFinished, RunStarted

        self.progress(event)
        if isinstance(event, RunStarted):
            draft = f" + draft {event.draft.name}" if event.draft else ""
            print(f"specpipe: {event.target.name} ({event.target.precision}){draft}, drafter={event.drafter}, "
                  f"budget={event.budget}, rollback={event.rollback}, {blas_phrase(blas_info())}", file=sys.stderr)
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
            out.write(f"\rprefill [{'#' * filled}{'.' * (self.WIDTH - filled)}] {event.tokens}/{event.total} tokens, "
                      f"{rate:.0f} tok/s")
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
