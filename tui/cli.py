"""`specpipe-chat`: the chat UI, launched like `specpipe`.

`specpipe-chat model=... draft=ngram budget.k=16` composes the same Hydra
config (one-line errors for bad overrides, exit 2), loads the models when the
first message is sent and records every answer to the run folder's
events.jsonl; `prompt=story` or `prompt.text=...` on the command line is sent
as the first message. `--replay PATH/events.jsonl [--speed X]` plays a
recorded run back without loading any model (X=1: recorded pace, 0: instant).
`--resume PATH` draws a saved chat (Ctrl+S) or a recording and continues it
live with the recorded config (`key=value` overrides change values in it).
`serve.url=http://127.0.0.1:8000` chats with a running `specpipe-serve` instead of
loading a model (its model, drafter and K; checked at start: exit 2 if unreachable).
`--web [--port N]` serves any of these in a browser at http://127.0.0.1:N
(textual-serve; one app process per browser tab, bound to localhost only).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field

from specpipe.cli.argv import is_hydra_meta, validate_overrides
from specpipe.cli.shell import EXIT_CONFIG, hydra_main, hydra_output_dir, preload_blas

DEFAULT_PORT = 8001  # not specpipe-serve's 8000 (conf/serve.yaml): the chat and a server it talks to run side by side
GROUPS = ("model", "draft", "quant", "budget", "rollback", "sampling", "compare", "prompt", "experiment")


@dataclass
class Flags:
    replay: str | None = None
    speed: float = 1.0
    resume: str | None = None
    web: bool = False
    port: int = DEFAULT_PORT
    serve_url: str | None = None  # chat with a running specpipe-serve
    rest: list[str] = field(default_factory=list)  # Hydra overrides


def main() -> None:
    try:
        flags = parse_flags(sys.argv[1:])
    except ValueError as exc:
        _fail(str(exc), EXIT_CONFIG)
    if flags.web:
        _serve(flags)
    elif flags.serve_url is not None:
        _chat_server(flags.serve_url)
    elif flags.replay is not None:
        if flags.rest:
            print(f"specpipe-chat: replay ignores the overrides {' '.join(flags.rest)}", file=sys.stderr)
        _replay(flags.replay, flags.speed)
    elif flags.resume is not None:
        _resume(flags.resume, flags.rest)
    else:
        _live(flags.rest)


def parse_flags(argv: list[str]) -> Flags:
    """Take specpipe-chat's own flags (also `--flag=value`) out of argv; the rest are Hydra overrides.

    Example: ["--replay", "e.jsonl", "--speed=0", "budget.k=4"]
    -> Flags(replay="e.jsonl", speed=0.0, rest=["budget.k=4"]).
    """
    values: dict[str, str] = {}
    flags, i = Flags(), 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name == "--web":
            flags.web = True
        elif name in ("serve.url", "+serve.url") and eq:
            flags.serve_url = value
        elif name in ("--replay", "--speed", "--resume", "--port"):
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{name} needs a value")
                value, i = argv[i + 1], i + 1
            values[name] = value
        else:
            flags.rest.append(arg)
        i += 1
    flags.replay, flags.resume = values.get("--replay"), values.get("--resume")
    try:
        flags.speed = float(values.get("--speed", "1"))
    except ValueError:
        raise ValueError(f"--speed {values['--speed']!r}: give a number (1 = recorded pace, 0 = instant)") from None
    if flags.speed < 0:
        raise ValueError(f"--speed {flags.speed:g}: must be 0 (instant) or more")
    if "--speed" in values and flags.replay is None:
        raise ValueError("--speed only applies to --replay PATH/events.jsonl")
    if flags.replay is not None and flags.resume is not None:
        raise ValueError("give --replay (watch a recording) or --resume (continue it), not both")
    if flags.serve_url is not None and (flags.replay or flags.resume or flags.rest):
        extra = " ".join(flags.rest) or "--replay/--resume"
        raise ValueError(
            f"serve.url chats with the server's own model and config: drop {extra} (or start specpipe-serve with it)"
        )
    if "--port" in values:
        if not flags.web:
            raise ValueError("--port only applies to --web")
        if not values["--port"].isdigit() or not 0 < int(values["--port"]) < 65536:
            raise ValueError(f"--port {values['--port']!r}: give a TCP port, 1..65535")
        flags.port = int(values["--port"])
    return flags


def parse_replay(argv: list[str]) -> tuple[str | None, float, list[str]]:
    """(replay path, speed, the rest): the replay flags alone, as `parse_flags` reads them."""
    flags = parse_flags(argv)
    return flags.replay, flags.speed, flags.rest


# ---- the four ways to start


def _live(rest: list[str]) -> None:
    sys.argv = sys.argv[:1] + rest  # Hydra reads sys.argv
    # prompt forms as in specpipe, the override check, one-line errors
    hydra_main("specpipe-chat", "config", _task, prompts=True)


def _task(cfg) -> None:
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    out = Path(hydra_output_dir() or "outputs/chat")
    # The CLI's prompt is the chat's first message, when the user named one (the default is only an example).
    asked = any(
        o.split("=", 1)[0] in ("prompt", "prompt.text", "+prompt.text") for o in HydraConfig.get().overrides.task
    )
    _run_live(cfg, out, first_message=cfg.prompt.text if asked else None)


def _run_live(cfg, out, history: list | None = None, first_message: str | None = None) -> None:
    from tui.app import ChatApp
    from tui.sources import LiveSource

    out.mkdir(parents=True, exist_ok=True)
    source = LiveSource(cfg, record_to=out / "events.jsonl")
    for event in history or []:
        source.record(event)  # the new recording holds the whole chat, so it can be resumed again
    app = ChatApp(
        source,
        title=f"{cfg.model.name} | draft={cfg.draft.name}",
        history=history,
        first_message=first_message,
        save_dir=out,
    )
    try:
        app.run()
    finally:
        source.close()
    print(f"specpipe-chat: events recorded to {out / 'events.jsonl'} (--resume it to continue)", file=sys.stderr)
    if app.return_code:
        sys.exit(app.return_code)  # 130 / 143 after SIGINT / SIGTERM


def _replay(path: str, speed: float) -> None:
    from tui.app import ChatApp
    from tui.sources import ReplaySource

    source = ReplaySource(_read(path), speed)
    app = ChatApp(source, title=f"replay {path}")
    app.run()
    if app.return_code:
        sys.exit(app.return_code)


def _chat_server(url: str) -> None:
    """Chat with a running specpipe-serve; an unusable URL or server is one line and exit 2, before the app."""
    from tui.server_source import ServerSource, ServerUnavailable, check_server

    try:
        model = check_server(url)
    except ServerUnavailable as exc:
        _fail(str(exc), EXIT_CONFIG)
    from tui.app import ChatApp

    source = ServerSource(url, model)
    app = ChatApp(source, title=f"{model} | server {source.url}")
    app.run()
    if app.return_code:
        sys.exit(app.return_code)


def _resume(path: str, overrides: list[str]) -> None:
    from datetime import datetime
    from pathlib import Path

    events = _read(path)
    try:
        cfg = recorded_config(events, overrides)
    except ValueError as exc:
        _fail(f"cannot resume {path}: {exc}", EXIT_CONFIG)
    preload_blas()
    _run_live(cfg, Path("outputs/chat") / f"{datetime.now():%Y-%m-%d/%H-%M-%S}", history=events)


def recorded_config(events: list, overrides: list[str]):
    """The config a recording was made with (its first RunStarted.config_yaml), with `key=value` overrides applied.

    The recording is data: its config is read and checked as a run folder's snapshot is (snapshot.py), so a
    `_target_` that is not one of specpipe's plug-ins, or a value the schemas refuse, is one line here,
    before the app starts or anything is imported.

    Raises:
        ValueError: no recorded config, a config that fails those checks, or an override that picks a
            group option (`draft=none`).
    """
    from omegaconf import OmegaConf

    from specpipe.config.snapshot import check_snapshot, read_snapshot_text
    from specpipe.errors import ConfigError
    from specpipe.events import RunStarted

    yaml = next((e.config_yaml for e in events if isinstance(e, RunStarted) and e.config_yaml), "")
    if not yaml:
        raise ValueError("the recording has no config (recorded before config_yaml existed); start a new chat")
    for override in overrides:
        key = override.split("=", 1)[0]
        if "=" not in override or key.lstrip("+~") in GROUPS:
            raise ValueError(f"{override!r}: a resumed chat keeps its groups; change values such as budget.k=8")
    where = "its recorded config (RunStarted.config_yaml)"
    try:
        read_snapshot_text(yaml, where)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    cfg = OmegaConf.merge(OmegaConf.create(yaml), OmegaConf.from_dotlist(overrides))
    message = check_snapshot(cfg, "config", where)
    if message:
        raise ValueError(message)
    return cfg


def _serve(flags: Flags) -> None:
    """Check the arguments here (one-line errors, exit 2), then serve; each browser tab runs its own app."""
    if flags.replay is not None:
        _read(flags.replay)
    elif flags.serve_url is not None:
        from tui.server_source import ServerUnavailable, check_server

        try:
            check_server(flags.serve_url)
        except ServerUnavailable as exc:
            _fail(str(exc), EXIT_CONFIG)
    elif flags.resume is not None:
        try:
            recorded_config(_read(flags.resume), flags.rest)
        except ValueError as exc:
            _fail(f"cannot resume {flags.resume}: {exc}", EXIT_CONFIG)
    elif not is_hydra_meta(flags.rest):
        message = validate_overrides(flags.rest)
        if message:
            _fail(message, EXIT_CONFIG)
    if not port_free(flags.port):
        _fail(f"port {flags.port} on 127.0.0.1 is in use: pass --port N with a free one", EXIT_CONFIG)
    from tui.web import LocalServer

    print(f"specpipe-chat: serving on http://127.0.0.1:{flags.port} (Ctrl+C stops)", file=sys.stderr)
    server = LocalServer(web_command(flags), port=flags.port)
    server.serve()
    sys.exit(server.exit_code)


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no conflict
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def web_command(flags: Flags) -> str:
    """The shell command textual-serve runs per browser tab: this CLI without --web / --port."""
    argv = [sys.executable, "-m", "tui.cli"]
    if flags.replay is not None:
        argv += ["--replay", flags.replay, "--speed", f"{flags.speed:g}"]
    if flags.resume is not None:
        argv += ["--resume", flags.resume]
    if flags.serve_url is not None:
        argv += [f"serve.url={flags.serve_url}"]
    return shlex.join(argv + flags.rest)


def _read(path: str) -> list:
    """The events of a recording, for --replay, --resume and --web alike: a torn last line (a crash,
    a full disk) is skipped with a notice, as docs/faults.md promises; anything else wrong is one line, exit 2."""
    import msgspec

    from tui.sources import ReplaySource

    try:
        events = ReplaySource.from_file(path).events  # the same checks a replay makes (a RunStarted, ...)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        _fail(f"cannot read {path}: {exc}", EXIT_CONFIG)
    return events


def _fail(message: str, code: int) -> None:
    print(f"specpipe-chat: error: {message}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
