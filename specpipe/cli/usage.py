"""What `--help`, `--version` and a mistyped flag say, for every console script.

Contract: `usage(tool)` is the teaching part of a command's `--help` (what it does, how to give it a prompt,
the five overrides people reach for first, the presets, where results go, where the docs are); Hydra's help
template (conf/hydra/specpipe.yaml) prints it above the option groups, through the `specpipe_usage` resolver.
`version_text()` names specpipe's version and its key dependencies'. `unknown_flag(argv, tool)` is the
one line for a `--flag` no command knows, with the closest known one. Nothing here loads a model.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Usage:
    summary: str  # one line: what the command does
    forms: tuple[str, ...]  # how it is started, one example a line
    overrides: tuple[str, ...]  # the five overrides people reach for first
    results: str  # where the results go


PROMPT_FORMS = (
    '"Rename x to y in: def f(x): ..."   the prompt as typed (positional)',
    '--prompt "it\'s (a, b)"              the same with a flag',
    "prompt.file=task.txt                the prompt from a file",
    "- < task.txt                        ... or from stdin",
)
GENERATE_OVERRIDES = (
    "draft=ngram | draft=none | draft=model draft.model=qwen2.5-coder-0.5b   who drafts (none: plain decoding)",
    "budget.k=16 | budget=auto                 tokens drafted per step (auto: chosen per step)",
    "max_tokens=128                            how long the answer may be",
    "model=qwen2.5-coder-1.5b | model.path=/x.gguf | model.path=org/repo   the target model",
    "sampling=sample sampling.temperature=0.7  sample instead of greedy (still lossless)",
)
RUN_FOLDER = (
    "outputs/<date>/<time>/ (events.jsonl, summary.json, the config in .hydra/); a sweep (-m) under "
    "outputs/multirun/; `--rerun RUN_DIR` runs one again with its exact config"
)

USAGES = {
    "specpipe": Usage(
        "speculative decoding as stages (draft, verify, compare, rollback, bonus): one answer, and whether it paid",
        tuple(f"specpipe {form}" for form in PROMPT_FORMS) + ("specpipe -m budget.k=4,8,16   a sweep, one table",),
        GENERATE_OVERRIDES,
        "the answer on stdout, figures on stderr; " + RUN_FOLDER,
    ),
    "specpipe-chat": Usage(
        "a terminal chat showing each step's accepted, rejected and bonus tokens",
        (
            "specpipe-chat [overrides]                    chat with the composed config (as specpipe)",
            "specpipe-chat --replay FILE [--speed X]      play a recording",
            "specpipe-chat --resume FILE                  continue a recorded chat",
            "specpipe-chat serve.url=http://127.0.0.1:8000   chat with a running specpipe-serve",
            "specpipe-chat --web [--port N]               the same in a browser (default port 8001)",
        ),
        GENERATE_OVERRIDES,
        "outputs/<date>/<time>/events.jsonl (a recording --replay plays); Ctrl+S saves the chat there",
    ),
    "specpipe-bench": Usage(
        "baseline vs speculative (vs mlx-lm) on each prompt of a suite, outputs checked equal",
        (
            "specpipe-bench suite=code limit=4",
            "specpipe-bench -m budget.k=4,8,16 suite=code,prose   then specpipe-bench-report <sweep dir>",
        ),
        (
            "suite=code | suite=prose | suite=math       which packaged prompts",
            "limit=4                                   only the first prompts of the suite",
            "draft=model draft.model=qwen2.5-coder-0.5b | draft=ngram   the drafter measured",
            "budget.k=16 | budget=auto                 tokens drafted per step",
            "repeats=3                                 timed repeats per prompt (noisy machines)",
        ),
        "bench.jsonl and summary.json in " + RUN_FOLDER,
    ),
    "specpipe-serve": Usage(
        "an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models) on 127.0.0.1",
        ("specpipe-serve port=8000", "specpipe-serve preset=real-pair budget=auto"),
        (
            "port=8000 | port=0                        where to listen (0: any free port, printed)",
            "max_batch=8                               requests decoded together (1: one at a time)",
            "allowed_origins=[http://localhost:3000]   a browser page that may call the API (CORS)",
            "draft=ngram | draft=model draft.model=qwen2.5-coder-0.5b   who drafts",
            "access_log=false                          no line per request on the console",
        ),
        "one console line per request; requests.jsonl and steps.jsonl in outputs/serve/<date>/<time>/",
    ),
    "specpipe-tune": Usage(
        "which drafter and budget are fastest for your prompts here, each output checked; the winner becomes a preset",
        ("specpipe-tune suites=[code,prose]", "specpipe-tune prompts.file=mine.jsonl suites=[]"),
        (
            "suites=[code,prose]                       the packaged prompts tried",
            "prompts.file=mine.jsonl                   your own prompts",
            '"drafts=[ngram,layerskip:12]"             the candidates',
            "model=qwen2.5-coder-1.5b | model.path=/x.gguf   the target",
            "save_as=tuned                             the preset written (then: specpipe preset=tuned)",
        ),
        "a preset in ~/.config/specpipe/preset/<save_as>.yaml; every measurement in outputs/tune/<save_as>.jsonl",
    ),
    "specpipe-calibrate": Usage(
        "this device's verify cost T(n)/T(1), at short and long contexts, and the draft's cost",
        (
            "specpipe-calibrate",
            "specpipe-calibrate model=qwen2.5-coder-1.5b draft=model draft.model=qwen2.5-coder-0.5b",
        ),
        (
            "model=qwen2.5-coder-1.5b | model.path=/x.gguf   the target timed",
            "draft=model draft.model=qwen2.5-coder-0.5b   also time a draft model",
            "quant=float32 | quant=mlx4                 the precision timed",
            "contexts=false                            skip the long-context curves (faster)",
            "check=false                               no measured run beside the prediction",
        ),
        "the cost curve in ~/.cache/specpipe (budget=auto reads it) and a run folder under outputs/",
    ),
    "specpipe-train-drafter": Usage(
        "train an MTP head for a frozen target, offline (then: specpipe draft=mtp)",
        (
            "specpipe-train-drafter model=smollm2-135m steps=600",
            "specpipe-train-drafter out=/tmp/head corpus=/path/to/code",
        ),
        (
            "model=smollm2-135m | model.path=/x.gguf   the frozen target",
            "steps=600                                 training steps",
            "corpus=/path/to/code                      a folder of text to train on",
            "out=/tmp/head                             where the head is written",
            "resume=false                              start over instead of resuming",
        ),
        "the head next to the model file (<model>.mtp-head, where draft=mtp looks) or at out=",
    ),
}


def docs_pointer() -> str:
    """Where the docs are: the checkout's docs/ folder when specpipe runs from one, else the README's name."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    return f"{docs.parent / 'README.md'} and {docs}/" if docs.is_dir() else "README.md and docs/ in specpipe's source"


def presets(config_name: str) -> list[str]:
    """`name  what it is` for each packaged preset (its first comment line after the command)."""
    from importlib import resources

    folder = resources.files("specpipe.conf").joinpath("preset")
    lines = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".yaml"):
            continue
        comments = [
            ln[1:].strip() for ln in entry.read_text().splitlines() if ln.startswith("#") and "@package" not in ln
        ]
        what = comments[0].split("--", 1)[-1].strip() if comments else ""
        lines.append(f"preset={entry.name[:-5]:<10} {what}")
    return lines


def usage(tool: str, config_name: str = "config") -> str:
    """The teaching part of `tool --help` (see the module docstring)."""
    u = USAGES.get(tool) or USAGES["specpipe"]
    parts = [f"{tool}: {u.summary}", "", "Usage:", *(f"  {f}" for f in u.forms), ""]
    parts += ["Most used overrides (key=value, any number, after the command):", *(f"  {o}" for o in u.overrides)]
    parts += ["", "Presets (ready-made settings):", *(f"  {p}" for p in presets(config_name))]
    parts += ["", f"Results: {u.results}", f"Docs: {docs_pointer()}"]
    return "\n".join(parts)


# ---------------------------------------------------------------- --version


def version_text() -> str:
    """specpipe's version and MLX's, mlx-lm's, Hydra's, and the BLAS MLX would use (loads no model)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    from specpipe.engine.load.blas import blas_info, blas_phrase

    return (
        f"specpipe {of('specpipe')} (MLX {of('mlx')}, mlx-lm {of('mlx-lm')}, Hydra {of('hydra-core')}, "
        f"{blas_phrase(blas_info())})"
    )


# ---------------------------------------------------------------- mistyped flags

# Every long flag a Hydra command takes: Hydra's own, and specpipe's (prompt forms, --rerun).
KNOWN_FLAGS = (
    "--help",
    "--hydra-help",
    "--version",
    "--cfg",
    "--resolve",
    "--package",
    "--run",
    "--multirun",
    "--shell-completion",
    "--config-path",
    "--config-name",
    "--config-dir",
    "--experimental-rerun",
    "--info",
    "--prompt",
    "--rerun",
)


def flags(argv: list[str]) -> list[str]:
    """The flag names in argv, without the values of flags that take one (`--prompt --help` asks for no help)."""
    from specpipe.cli.prompt_args import FLAGS_WITH_VALUE

    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.partition("=")[0]
        if arg.startswith("-") and arg != "-":
            out.append(name)
        skip = (name in FLAGS_WITH_VALUE or name == "--prompt") and "=" not in arg
    return out


def unknown_flag(argv: list[str], tool: str, extra: tuple[str, ...] = ()) -> str | None:
    """One line for the first `--flag` in argv that no command knows (`--promt` -> did you mean --prompt?)."""
    known = KNOWN_FLAGS + extra
    for name in flags(argv):
        if not name.startswith("--") or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"`{tool} --help` lists what it takes"
        return f"unknown flag {name}: {hint} (settings are key=value, e.g. max_tokens=64)"
    return None
