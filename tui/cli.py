"""`specpipe-chat`: the chat UI, launched like `specpipe`.

`specpipe-chat model=... draft=ngram budget.k=16` composes the same Hydra
config (one-line errors for bad overrides, exit 2), loads the models when the
first message is sent and records every answer to the run folder's
events.jsonl. `specpipe-chat --replay PATH/events.jsonl [--speed X]` plays a
recorded run back without loading any model (X=1: recorded pace, 0: instant).
"""

from __future__ import annotations

import sys

from specpipe.cli import EXIT_CONFIG, _is_hydra_meta, _preload_blas, validate_overrides


def main() -> None:
    try:
        replay, speed, rest = parse_replay(sys.argv[1:])
    except ValueError as exc:
        _fail(str(exc), EXIT_CONFIG)
    if replay is not None:
        if rest:
            print(f"specpipe-chat: replay ignores the overrides {' '.join(rest)}", file=sys.stderr)
        _replay(replay, speed)
        return
    _preload_blas()
    sys.argv = sys.argv[:1] + rest  # Hydra reads sys.argv
    if not _is_hydra_meta(rest):
        message = validate_overrides(rest)
        if message:
            _fail(message, EXIT_CONFIG)
    import hydra

    import specpipe.config  # noqa: F401  (registers the schemas)

    hydra.main(version_base=None, config_path="pkg://specpipe.conf", config_name="config")(_task)()


def parse_replay(argv: list[str]) -> tuple[str | None, float, list[str]]:
    """Take `--replay PATH` and `--speed X` (also `--flag=value`) out of argv.

    Example: ["--replay", "e.jsonl", "--speed=0", "budget.k=4"] -> ("e.jsonl", 0.0, ["budget.k=4"]).
    """
    values: dict[str, str] = {}
    rest, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--replay", "--speed"):
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{name} needs a value")
                value, i = argv[i + 1], i + 1
            values[name] = value
        else:
            rest.append(arg)
        i += 1
    try:
        speed = float(values.get("--speed", "1"))
    except ValueError:
        raise ValueError(f"--speed {values['--speed']!r}: give a number (1 = recorded pace, 0 = instant)") from None
    if speed < 0:
        raise ValueError(f"--speed {speed:g}: must be 0 (instant) or more")
    if "--speed" in values and "--replay" not in values:
        raise ValueError("--speed only applies to --replay PATH/events.jsonl")
    return values.get("--replay"), speed, rest


def _replay(path: str, speed: float) -> None:
    import msgspec

    from tui.app import ChatApp
    from tui.sources import ReplaySource

    try:
        source = ReplaySource.from_file(path, speed)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        _fail(f"cannot replay {path}: {exc}", EXIT_CONFIG)
    ChatApp(source, title=f"replay {path}").run()


def _task(cfg) -> None:
    from pathlib import Path

    from specpipe.runner import _hydra_dir
    from tui.app import ChatApp
    from tui.sources import LiveSource

    out = Path(_hydra_dir() or "outputs/chat")
    out.mkdir(parents=True, exist_ok=True)
    source = LiveSource(cfg, record_to=out / "events.jsonl")
    try:
        ChatApp(source, title=f"{cfg.model.name} | draft={cfg.draft.name}").run()
    finally:
        source.close()
    print(f"specpipe-chat: events recorded to {out / 'events.jsonl'}", file=sys.stderr)


def _fail(message: str, code: int) -> None:
    print(f"specpipe-chat: error: {message}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
