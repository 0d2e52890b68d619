"""argv as Hydra will read it: the prompt forms (prompt_args.py), `--rerun RUN_DIR`, Hydra's flags moved
before the overrides, and every override checked by composing the config first, so a bad one is one
line (exit 2) before anything loads. Used by every command through `shell.hydra_main`.
"""

from __future__ import annotations

import sys

from specpipe.cli.shell import EXIT_CONFIG, fail


def prepare_argv(config_name: str, tool: str, prompts: bool = True) -> list[str]:
    """Read sys.argv as Hydra will, after the prompt forms (specpipe/cli/prompt_args.py) and
    `--rerun RUN_DIR` are turned into Hydra's own arguments; exit with one line on bad input.

    Sets sys.argv to what Hydra should parse and returns the arguments after the program name.
    """
    from specpipe.cli.prompt_args import PromptArgError, expand_prompt_args

    argv = sys.argv[1:]
    try:
        argv = rerun_args(argv)
        if prompts:
            argv = expand_prompt_args(argv)
    except (PromptArgError, ValueError) as exc:
        fail(tool, str(exc), EXIT_CONFIG)
    argv = flags_first(argv)
    if config_name == "serve":
        from specpipe.serve.api_key import key_off_the_command_line

        argv = key_off_the_command_line(argv)
    sys.argv = sys.argv[:1] + argv
    modes = [
        a
        for a in argv
        if a.partition("=")[0] in ("-m", "--multirun", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion")
    ]
    if len(modes) > 1:  # Hydra's own check raises a traceback
        fail(
            tool,
            f"{' and '.join(modes)} cannot be combined: Hydra does one of them (drop -m to print one job's config)",
            EXIT_CONFIG,
        )
    if not is_hydra_meta(argv):
        config_dir = flag_value(argv, "-cp", "--config-path")
        search_dir = flag_value(argv, "-cd", "--config-dir")  # a user's folder of presets / options
        name = flag_value(argv, "-cn", "--config-name") or config_name
        from specpipe.run.run_folder import claim_override

        message = validate_overrides(
            argv, name, tool, config_dir=config_dir, app=config_name, search_dir=search_dir
        ) or claim_override(argv)
        if message:
            fail(tool, message, EXIT_CONFIG)
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
            snapshot = os.path.isfile(os.path.join(folder, "config.yaml")) and os.path.isfile(
                os.path.join(folder, "overrides.yaml")
            )
            if name == "--rerun" and not snapshot:
                raise ValueError(f"{value} is not a run folder (no .hydra/config.yaml): give a folder under outputs/")
            if name in ("-cp", "--config-path") or snapshot:
                out += ["-cp", folder] + (
                    [] if snapshot is False or flag_value(argv, "-cn", "--config-name") else ["-cn", "config"]
                )
            else:
                out += [name, folder]
        else:
            out.append(arg)
        i += 1
    return out


def flag_value(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in names:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def validate_overrides(
    overrides: list[str],
    config_name: str = "config",
    tool: str = "specpipe",
    config_dir: str | None = None,
    app: str = "config",
    search_dir: str | None = None,
) -> str | None:
    """Compose the config to catch bad overrides; return a one-line message or None.

    With -m / --multirun every job of the sweep is composed (Hydra would
    otherwise fail in the middle of the sweep, with its own multi-line error).
    Hydra's own node is composed too (`hydra/launcher=nosuch`, a run folder with a comma) and may name
    only Hydra's own classes. `config_dir`: a folder of configs (a run's .hydra/ snapshot) instead of
    specpipe's own; a snapshot is read as data first and typed again by the schemas of `conf/<app>.yaml`
    (snapshot.py), so an edited, cut or foreign one is one line before anything is imported or loaded.
    `search_dir`: `--config-dir DIR`, searched after specpipe's own configs (a user's presets), as Hydra does.
    """
    import os

    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    import specpipe.config.schema  # noqa: F401
    from specpipe.config.plugin_targets import check_hydra_targets, check_targets
    from specpipe.config.preflight import check_config, check_overrides_text
    from specpipe.config.shared_config import check_shared_files, shared_folders
    from specpipe.config.snapshot import is_snapshot_dir, read_snapshot_file, retype
    from specpipe.errors import ConfigError
    from specpipe.run import signals

    if check_overrides_text(overrides):
        return check_overrides_text(overrides)
    shared = shared_folders(search_dir)
    message = check_shared_files(shared)
    if message:
        return message
    snapshot = bool(config_dir) and config_name == "config" and is_snapshot_dir(str(config_dir))
    if snapshot:
        try:
            saved = read_snapshot_file(f"{config_dir}/config.yaml")
        except ConfigError as exc:
            return str(exc)
        chosen = any(o.lstrip("+").partition("=")[0] == "output_dir" for o in overrides)
        if saved.get("output_dir") is not None and not chosen:
            return (
                f"{config_dir}/config.yaml sets output_dir={saved['output_dir']!r}: output locations come only from "
                "the command line; add output_dir=<folder> (or output_dir=null for a fresh run folder)"
            )
    multirun = any(a in ("-m", "--multirun") for a in overrides)
    plain = overrides_only(overrides)
    searchpath = [f"hydra.searchpath=[file://{os.path.abspath(search_dir)}]"] if search_dir else []
    init = (
        initialize_config_dir(config_dir=config_dir, version_base=None)
        if config_dir
        else initialize_config_module(config_module="specpipe.conf", version_base=None)
    )
    try:
        jobs = sweep_jobs(plain) if multirun else [plain]
        with init:
            for job in jobs:
                # a stop signal waits for this job's check, then raises: one that lands inside OmegaConf leaves a
                # half-built node whose next error would read as a bad configuration (exit 2, not 130 / 143)
                with signals.deferred():
                    try:
                        cfg = compose(config_name=config_name, overrides=[*job, *searchpath], return_hydra_config=True)
                        # a named class first (the most precise line), then what else the shared folders changed
                        message = check_hydra_targets(cfg.hydra) or check_targets(cfg)
                        if not message and shared and not config_dir:
                            message = compare_with_packaged(cfg, config_name, job, shared)
                        with open_dict(cfg):
                            cfg.pop("hydra")
                        if not message and snapshot:
                            cfg = retype(cfg, app, where=f"{config_dir}/config.yaml")
                        message = message or check_config(cfg)
                    except ConfigError as exc:
                        message = str(exc)
                    except (HydraException, OmegaConfBaseException) as exc:
                        message = describe_config_error(exc)
                if message:
                    where = f" (in the sweep job {' '.join(job)})" if len(jobs) > 1 else ""
                    return message.replace("`specpipe --cfg", f"`{tool} --cfg") + where
    except (HydraException, OmegaConfBaseException) as exc:  # the sweep syntax itself
        return describe_config_error(exc)
    return None


def compare_with_packaged(cfg, config_name: str, job: list[str], shared: list) -> str | None:
    """What the shared folders changed beyond what a shared file may set (shared_config.py), by composing
    the same command line again from the packaged files alone."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from specpipe.config.shared_config import check_shared_effect, packaged_overrides
    from specpipe.config.user_config import packaged_only

    where = " and ".join(str(f) for f in shared)
    try:
        with packaged_only():
            packaged = compose(config_name=config_name, overrides=packaged_overrides(job), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:
        return f"{describe_config_error(exc)} (without {where}: a shared config folder may not supply Hydra's options)"
    return check_shared_effect(
        OmegaConf.to_container(cfg, resolve=False),  # type: ignore[arg-type]
        OmegaConf.to_container(packaged, resolve=False),  # type: ignore[arg-type]
        where,
    )


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
            axes.append([str(o.input_line)])
    return [list(job) for job in itertools.product(*axes)]


def describe_config_error(exc: Exception) -> str:
    """One actionable line from Hydra/OmegaConf's multi-line messages."""
    import re

    text = str(exc)
    cause = str(exc.__cause__ or "")
    missing = re.search(r"Could not find '(.+)/([^/']+)'", text)
    if missing:
        group, option = missing.groups()
        options = [
            o.strip() for o in text.split(f"Available options in '{group}':")[-1].split("Config search path")[0].split()
        ]
        return f"unknown option {group}={option}: choose one of {', '.join(options)}"
    key = re.search(r"full_key: (\S+)", cause)
    if "not in" in cause and key:
        return f"unknown config key {key.group(1)!r}: check the spelling (`specpipe --cfg job` lists every key)"
    ambiguous = re.search(r"Ambiguous value for argument '([^=']+)=(.*)'", text)
    if ambiguous:
        name, value = ambiguous.groups()
        return (
            f"{name}={value} has a comma, which Hydra reads as a sweep: quote the value "
            f"(\"{name}='{value}'\") or add -m to sweep over it"
        )
    if "could not be converted" in cause and key:
        return f"{key.group(1)}: {cause.splitlines()[0]}"
    return "bad configuration: " + " ".join(text.split())


def flags_first(argv: list[str]) -> list[str]:
    """Hydra's flags (with their values) before the overrides: Hydra's argparse rejects overrides
    that follow a flag (`a=1 -m b=2` fails with "unrecognized arguments: b=2")."""
    from specpipe.cli.prompt_args import FLAGS_WITH_VALUE, INFO_VALUES

    flags, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            flags.append(arg)
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if (
                nxt is not None
                and not nxt.startswith("-")
                and "=" not in arg
                and (arg in FLAGS_WITH_VALUE or (arg in ("-i", "--info") and nxt in INFO_VALUES))
            ):
                flags.append(nxt)
                i += 1
        else:
            overrides.append(arg)
        i += 1
    return flags + overrides


def overrides_only(argv: list[str]) -> list[str]:
    """argv without Hydra's flags and their values (`-cp DIR`, `-cn NAME`, `-m`)."""
    from specpipe.cli.prompt_args import FLAGS_WITH_VALUE

    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in FLAGS_WITH_VALUE:
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


def is_hydra_meta(argv: list[str]) -> bool:
    """Flags Hydra handles itself (help, --cfg, --info, shell completion): skip pre-validation.

    -m sweeps and -cp / -cn / --config-dir runs are validated.
    """
    meta = (
        "-h",
        "--help",
        "--hydra-help",
        "-c",
        "--cfg",
        "--info",
        "-i",
        "-sc",
        "--shell-completion",
        "--resolve",
        "--version",
    )
    own = ("--multirun", "--config-path", "--config-name", "--config-dir")
    return any(a.partition("=")[0] in meta or (a.startswith("--") and a.partition("=")[0] not in own) for a in argv)
