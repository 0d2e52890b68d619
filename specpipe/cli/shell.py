"""One entry wrapper for every Hydra command: the same start, the same one-line errors.

Contract: `hydra_main(tool, config_name, task)` installs the stop signals, preloads the BLAS,
prepares argv (`argv.prepare_argv`: prompt forms, `--rerun`, flags first, the override check)
and runs `task(cfg)` under Hydra. Whatever `task` raises ends as one line on stderr and an exit
code, never a traceback: `SpecpipeError` -> its `exit_code` (2 config, 1 run), `Stopped` or a stop
signal -> 130 / 143 / 129 / 141 (docs/faults.md). A run folder holding nothing but Hydra's own
snapshot is removed on the way out, so a failed start leaves no clutter.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from specpipe.errors import EXIT_CONFIG, EXIT_RUN
from specpipe.run.run_folder import hydra_output_dir

EXIT_INTERRUPTED = 130

__all__ = [
    "EXIT_CONFIG",
    "EXIT_INTERRUPTED",
    "EXIT_RUN",
    "Stopped",
    "fail",
    "hydra_main",
    "hydra_output_dir",
    "preload_blas",
    "print_result",
]


class Stopped(Exception):
    """A stop signal ended the task; the message says what was kept (`": every finished prompt is in ..."`)."""


def hydra_main(
    tool: str, config_name: str, task: Callable, *, prompts: bool = False, interrupted: str = "; nothing was written"
) -> None:
    """Run `task(cfg)` as the console script `tool` over `conf/<config_name>.yaml`.

    Args:
        prompts: argv may carry a prompt (positional text, `--prompt`, `-`), as `specpipe` takes it.
        interrupted: what a stop before `task` says it kept, after "stopped by SIGINT".
    """
    from specpipe.cli.argv import prepare_argv
    from specpipe.run import signals

    signals.install()  # SIGTERM / SIGHUP stop a command as Ctrl-C does

    def guarded(cfg) -> None:
        preload_blas()  # a launcher (joblib, submitit) runs jobs in fresh processes that skipped this function

        def body() -> None:
            signals.check()  # a stop that landed while Hydra started is raised here, before any load
            task(cfg)

        with signals.undeferred():
            run_guarded(tool, body, interrupted)

    def start() -> None:
        from specpipe.run.run_folder import name_tool

        name_tool(tool)
        preload_blas()
        with signals.deferred():  # a stop inside these imports left half-initialised modules (Hydra's schemas)
            import hydra.core.override_parser.overrides_parser  # noqa: F401
            import omegaconf  # noqa: F401
        from specpipe.cli.usage import flags, unknown_flag, version_text

        if "--version" in flags(sys.argv[1:]):  # Hydra's own --version names only Hydra
            print_result(tool, version_text(), kept="nothing to keep")
            return
        mistyped = unknown_flag(sys.argv[1:], tool)
        if mistyped:  # before Hydra, whose answer is its whole usage block
            fail(tool, mistyped, EXIT_CONFIG)
        argv = prepare_argv(config_name, tool, prompts=prompts)
        from specpipe.cli.argv import is_hydra_meta

        if is_hydra_meta(argv):  # Hydra prints (--help, --cfg job): a full or closed stdout is our one line
            sys.stdout = signals.GuardedStdout(sys.stdout)
        import hydra

        import specpipe.config.schema  # noqa: F401  (registers the schemas)

        # a stop inside Hydra's own start (its override parser, the run folder, logging) waits for the task's
        # start: raised there it was swallowed now and then (the run went on, exit 0) or became Hydra's error
        with signals.deferred():
            hydra.main(version_base=None, config_path="pkg://specpipe.conf", config_name=config_name)(guarded)()

    # A stop before the task (imports, the override check, Hydra's own start: a second or more) is
    # one line too; `guarded` handles the ones that land inside the task.
    run_guarded(tool, start, interrupted)


def run_guarded(tool: str, body: Callable[[], None], interrupted: str = "; nothing was written") -> None:
    """Call `body()`; a user error or a stop becomes one line and an exit code."""
    from specpipe.errors import SpecpipeError
    from specpipe.run import signals

    try:
        body()
    except SpecpipeError as exc:
        drop_empty_run_folder()
        fail(tool, str(exc), exc.exit_code)
    except Stopped as exc:
        fail(tool, f"stopped by {signals.name()}{exc}", signals.exit_code())
    except KeyboardInterrupt:
        drop_empty_run_folder()
        fail(tool, f"stopped by {signals.name()}{interrupted}", signals.exit_code())
    except Exception:
        # a KeyboardInterrupt that landed in a library's cleanup comes out as another exception
        # (OmegaConf: AttributeError on a half-built node): after a stop signal, it is that stop
        if signals.received() not in signals.STOP_SIGNALS:
            raise
        drop_empty_run_folder()
        fail(tool, f"stopped by {signals.name()}{interrupted}", signals.exit_code())


def print_result(tool: str, text: str, kept: str) -> None:
    """`text` on stdout. A stdout that cannot take it (a closed pipe: 141; a full disk or an I/O error
    behind a redirect: 74) is one line saying where the result is kept (`kept`), never a traceback."""
    from specpipe.run import signals

    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except OSError as exc:
        signals.note_stdout_lost(exc)  # also points stdout at /dev/null: the interpreter's last flush is quiet
        fail(tool, f"cannot write to stdout ({exc.strerror}): {kept}", signals.exit_code())


def fail(tool: str, message: str, code: int) -> None:
    """`tool: error: message` on stderr, exit `code` (the code even when stderr cannot be written)."""
    try:
        print(f"{tool}: error: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    sys.exit(code)


def preload_blas() -> None:
    """Load the fastest BLAS before anything imports MLX. Says nothing here: which BLAS is in use
    (and how to get a fast one) is part of the run's header line, so a bad-input error stays one line."""
    try:
        from specpipe.engine.load.blas import preload_blas as preload
        from specpipe.engine.load.blas import requested_threads
    except ImportError:
        return
    try:
        threads = requested_threads(sys.argv[1:])  # blas.threads=N: OpenBLAS reads it once, at load
    except ValueError as exc:
        print(f"{sys.argv[0].rsplit('/', 1)[-1]}: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    preload(threads=threads)


def drop_empty_run_folder() -> None:
    """Hydra makes the run folder before the task; a task that failed before writing anything
    leaves nothing worth keeping there (only Hydra's own .hydra/ snapshot), so remove it."""
    from pathlib import Path

    from specpipe.run.run_folder import claimed

    try:
        out = hydra_output_dir()
    except Exception:  # noqa: BLE001  (a stop cut `import hydra` short: Hydra made no folder yet)
        out = None
    # a stop between Hydra's snapshot and the task finds Hydra's config already reset: the folders this
    # process claimed (hydra.run.dir=..., the default one) are the same run's
    for folder in {Path(p) for p in ([out] if out else []) + claimed()}:
        _drop_if_empty(folder)


def _drop_if_empty(folder) -> None:
    import shutil

    if not folder.is_dir():
        return
    leftovers = [
        p for p in folder.iterdir() if p.name != ".hydra" and not (p.suffix == ".log" and p.stat().st_size == 0)
    ]
    if not leftovers:
        shutil.rmtree(folder, ignore_errors=True)
        for parent in (folder.parent, folder.parent.parent):  # the date folder, then outputs/, if now empty
            try:
                parent.rmdir()
            except OSError:
                break
