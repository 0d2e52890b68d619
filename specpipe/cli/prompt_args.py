"""Prompt text from the command line, a file or stdin, turned into one Hydra override.

`expand_prompt_args(argv)` rewrites the ways people type a prompt into a quoted
`prompt.text='...'` override, so the run's snapshot (`.hydra/overrides.yaml`,
`config.yaml`) holds the literal text and a re-run needs no file:

    specpipe "Rename x to y in: def f(x): return x + 1"     positional text
    specpipe --prompt "it's (a, b)"                          --prompt TEXT / --prompt=TEXT
    specpipe prompt.file=task.txt                            a file ...
    specpipe - < task.txt      (or prompt.file=-)            ... or stdin
    specpipe prompt.text=def f(x): return x                  unquoted: quoted for Hydra when it cannot parse it

It never touches other overrides, and raises PromptArgError (one line) for a
missing or unreadable file, undecodable bytes, or two prompts at once.
"""

from __future__ import annotations

import re
import sys
from typing import TextIO

TEXT_KEYS = ("prompt.text", "prompt.system")  # free text: quoted when Hydra's grammar would reject it
_OVERRIDE = re.compile(
    r"^(~[A-Za-z_][\w.@/-]*(=.*)?$|\+{0,2}[A-Za-z_][\w.@/-]*=)"
)  # key=v, ++key=v, ~key, hydra/launcher=x
# Hydra's flags that take the next argument as their value (not a prompt); --info's value is optional.
# cli.py reads the same tables to move flags before overrides.
FLAGS_WITH_VALUE = {
    "-cp",
    "--config-path",
    "-cn",
    "--config-name",
    "-cd",
    "--config-dir",
    "-c",
    "--cfg",
    "-p",
    "--package",
    "-sc",
    "--shell-completion",
    "--experimental-rerun",
    "--rerun",
}
INFO_VALUES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


class PromptArgError(ValueError):
    """A prompt that could not be read; the message is one line for the user."""


def hydra_quote(text: str) -> str:
    """Quote `text` so Hydra's override grammar and OmegaConf's interpolation give it back unchanged.

    Hydra: inside '...' a quote is escaped as \\' and backslashes before a quote or at the end are
    doubled. OmegaConf: `${` starts an interpolation unless escaped, and n backslashes before it
    become 2n + 1. Example: it's ${x} -> 'it\\'s \\${x}'.
    """
    s = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    s = re.sub(r"(\\+)(?='|\Z)", lambda m: m.group(1) * 2, s)  # \Z: $ also matches before a final newline
    return "'" + s.replace("'", "\\'") + "'"


def expand_prompt_args(argv: list[str], stdin: TextIO | None = None) -> list[str]:
    """Return argv with every prompt form replaced by `prompt.text=<quoted text>` (see the module docstring)."""
    stdin = sys.stdin if stdin is None else stdin
    for n, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 reach Python as lone surrogates
            raise PromptArgError(
                f"argument {n} is not UTF-8 text: convert it (e.g. with iconv) or put the text in a file, "
                "prompt.file=PATH"
            ) from None
    out: list[str] = []
    texts: list[tuple[str, str]] = []  # (how it was given, text)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--prompt", "--prompt-file"):
            if i + 1 >= len(argv):
                raise PromptArgError(
                    f"{arg} needs a value, e.g. {arg} " + ('"Hello"' if arg == "--prompt" else "task.txt")
                )
            value, i = argv[i + 1], i + 1
            texts.append((arg, value if arg == "--prompt" else _read(value, stdin)))
        elif arg.startswith("--prompt="):
            texts.append(("--prompt", arg.partition("=")[2]))
        elif arg.startswith("--prompt-file="):
            texts.append(("--prompt-file", _read(arg.partition("=")[2], stdin)))
        elif arg.startswith("prompt.file="):
            texts.append(("prompt.file", _read(arg.partition("=")[2], stdin)))
        elif (
            (arg in FLAGS_WITH_VALUE or arg in ("-i", "--info"))
            and i + 1 < len(argv)
            and not argv[i + 1].startswith("-")
            and (arg in FLAGS_WITH_VALUE or argv[i + 1] in INFO_VALUES)
        ):
            out += [arg, argv[i + 1]]
            i += 1
        elif arg == "-":
            texts.append(("-", _read("-", stdin)))
        elif not arg.startswith("-") and not _OVERRIDE.match(arg):
            texts.append(("text", arg))  # positional: any argument that is not key=value
        else:
            out.append(_quote_free_text(arg) if not _is_multirun(argv) else arg)
        i += 1
    if len(texts) > 1:
        raise PromptArgError(f"two prompts given ({', '.join(how for how, _ in texts)}): give one")
    if texts:
        if any(a.startswith(("prompt.text=", "+prompt.text=")) for a in out):
            raise PromptArgError(f"two prompts given (prompt.text and {texts[0][0]}): give one")
        out.append("prompt.text=" + hydra_quote(texts[0][1]))
    return out


def _quote_free_text(arg: str) -> str:
    """`prompt.text=def f(x): ...` -> quoted, when Hydra would reject the unquoted value."""
    key, eq, value = arg.partition("=")
    if not eq or key.lstrip("+") not in TEXT_KEYS or _parses_as_text(arg):
        return arg
    return f"{key}={hydra_quote(value)}"


def _parses_as_text(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_override(override)
    except HydraException:
        return False
    return not parsed.is_sweep_override() and isinstance(parsed.value(), (str, type(None)))


def _is_multirun(argv: list[str]) -> bool:
    # In a sweep `prompt.text=a,b` means two prompts: leave such values to Hydra.
    return any(a in ("-m", "--multirun") for a in argv)


def _read(path: str, stdin: TextIO) -> str:
    if path == "-":
        if stdin.isatty():
            raise PromptArgError(
                "the prompt comes from stdin (-), but stdin is a terminal: pipe text in, e.g. `specpipe - < task.txt`"
            )
        try:
            return stdin.read()
        except UnicodeDecodeError as exc:
            raise PromptArgError(
                f"stdin is not UTF-8 text ({exc.reason} at byte {exc.start}): convert it, e.g. with iconv"
            ) from None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise PromptArgError(f"prompt file {path} does not exist: check the path") from None
    except IsADirectoryError:
        raise PromptArgError(f"prompt file {path} is a folder: give a text file") from None
    except UnicodeDecodeError as exc:
        raise PromptArgError(
            f"prompt file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}): convert it, e.g. with iconv"
        ) from None
    except OSError as exc:
        raise PromptArgError(f"cannot read prompt file {path}: {exc.strerror}") from None
