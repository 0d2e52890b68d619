"""What `specpipe-tune` measures: candidates, task kinds, and one bench config per measurement.

Contract: `parse_candidate("model:qwen2.5-coder-0.5b")` -> a Candidate (bad specs: SpecpipeError, exit 2);
`task_kinds(cfg, folder)` -> the kinds to measure (packaged suites, and the user's prompts written once as a
suite file); `bench_node(cfg, candidate, kind, budget_k, fixed_ks, results)` -> the composed bench config the
bench's own `run_bench` measures, with tune's own keys removed so that its config hash (what resume matches
on) depends only on what is measured. Nothing here loads a model.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

from specpipe.errors import ConfigError

TUNE_KEYS = ("drafts", "suites", "prompts", "ks", "widen_to", "widen_at", "pays_at", "save_as", "fresh", "preset")
# candidate spec -> which draft key its ":value" sets, and how to read it
VALUE_KEYS = {"model": ("model", str), "layerskip": ("depth", int)}


@dataclass(frozen=True)
class Candidate:
    spec: str  # as the user wrote it: "ngram", "model:qwen2.5-coder-0.5b", "ngram/tree"
    draft: str  # the draft group's option
    values: dict = field(default_factory=dict)  # keys of that option the spec sets
    tree: bool = False  # verify a token tree (tree=dynamic) instead of a chain

    def overrides(self) -> list[str]:
        """The command-line words that select this candidate: `draft=model draft.model=x tree=dynamic`."""
        words = [f"draft={self.draft}", *(f"draft.{k}={v}" for k, v in self.values.items())]
        return words + (["tree=dynamic"] if self.tree else [])

    def label(self) -> str:
        return " ".join(self.overrides())


@dataclass(frozen=True)
class Kind:
    name: str  # what the verdict calls it: the suite's name, or prompts.kind
    suite: str | None  # a packaged suite
    path: str | None = None  # or a JSONL of the user's prompts
    format: str = "jsonl"  # the bench's suite.format: jsonl, or spec-bench (a verdict per Spec-Bench task)
    per_category: int | None = None


def parse_candidate(spec: str) -> Candidate:
    """`DRAFT[:VALUE][/tree]` -> Candidate; a draft option specpipe lacks is one line naming the choices."""
    from importlib import resources

    text, _, shape = spec.partition("/")
    if shape not in ("", "tree"):
        raise ConfigError(f"drafts entry {spec!r}: after '/' only 'tree' (a token tree), e.g. ngram/tree")
    draft, _, value = text.partition(":")
    options = sorted(
        p.name[:-5] for p in resources.files("specpipe.conf").joinpath("draft").iterdir() if p.name.endswith(".yaml")
    )
    if draft not in options or draft == "none":
        choices = ", ".join(o for o in options if o != "none")
        raise ConfigError(
            f"drafts entry {spec!r}: no drafter {draft!r}; choose from {choices} (plain decoding is always measured)"
        )
    values: dict = {}
    if value:
        if draft not in VALUE_KEYS:
            raise ConfigError(
                f"drafts entry {spec!r}: {draft} takes no ':value' (model:<name> and layerskip:<depth> do)"
            )
        key, kind = VALUE_KEYS[draft]
        try:
            values[key] = kind(value)
        except ValueError:
            raise ConfigError(f"drafts entry {spec!r}: {draft}:{value} needs a number (layerskip:12)") from None
    return Candidate(spec=spec, draft=draft, values=values, tree=bool(shape))


def task_kinds(cfg, folder: Path) -> list[Kind]:
    """The packaged suites asked for, then the user's prompts (a file or stdin) as one kind."""
    from specpipe.bench.records import suite_names

    kinds = []
    for name in cfg.suites or []:
        if name not in suite_names():
            raise ConfigError(f"suites: no packaged suite {name!r}; choose from {', '.join(suite_names())}")
        kinds.append(Kind(name=name, suite=name))
    if cfg.prompts.file and cfg.prompts.format == "spec-bench":  # the bench's reader; records carry each task
        if not Path(cfg.prompts.file).is_file():
            raise ConfigError(f"prompts.file={cfg.prompts.file} does not exist: give Spec-Bench's question.jsonl")
        path = str(Path(cfg.prompts.file).resolve())
        kinds.append(Kind(cfg.prompts.kind, None, path, "spec-bench", cfg.prompts.per_category))
    elif cfg.prompts.file:
        if cfg.prompts.format not in ("jsonl", "text"):
            raise ConfigError(f"prompts.format={cfg.prompts.format}: choose jsonl, text or spec-bench")
        kinds.append(
            Kind(name=cfg.prompts.kind, suite=None, path=str(user_prompts(cfg.prompts.file, cfg.prompts.kind, folder)))
        )
    if not kinds:
        raise ConfigError("nothing to tune on: name suites=[code,prose] or give your prompts with prompts.file=FILE")
    return kinds


def user_prompts(source: str, kind: str, folder: Path) -> Path:
    """The user's prompts as a suite file under `folder` (same text -> same file, so a rerun resumes).

    A `.jsonl` file is used as it is; other text (a file, or stdin for "-") holds one prompt, or several
    split by lines that are only `---`.
    """
    if source != "-" and source.endswith(".jsonl"):
        if not Path(source).is_file():
            raise ConfigError(
                f'prompts.file={source} does not exist: give a JSONL of {{"id", "prompt"}} lines or a text file'
            )
        return Path(source).resolve()
    if source == "-":
        text = sys.stdin.read()
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(
                f"prompts.file={source} does not exist: give a text file (prompts split by --- lines) or -"
            )
        text = path.read_text(encoding="utf-8")
    blocks: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.strip() == "---":
            blocks.append("\n".join(current).strip())
            current = []
        else:
            current.append(line)
    blocks = [b for b in [*blocks, "\n".join(current).strip()] if b]
    if not blocks:
        raise ConfigError(f"prompts.file={source} holds no prompt: write one, or several split by --- lines")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{kind}.prompts.jsonl"
    out.write_text("".join(json.dumps({"id": f"{kind}-{i + 1}", "prompt": b}) + "\n" for i, b in enumerate(blocks)))
    return out


def bench_node(
    cfg, candidate: Candidate, kind: Kind, budget_k: int | None, fixed_ks: list[int], results: Path
) -> DictConfig:
    """The bench config of one measurement: the candidate under budget=auto (budget_k None) or fixed K."""
    from specpipe.config.config_groups import with_group

    node = with_group(cfg, "draft", candidate.draft, **candidate.values)
    if budget_k is not None:
        node = with_group(node, "budget", "fixed", k=budget_k)
    elif node.budget.name != "auto":  # the user's own budget.* values stay when they already chose auto
        node = with_group(node, "budget", "auto")
    if candidate.tree:
        node = with_group(node, "tree", "dynamic")
    # the composed suite node keeps its schema's keys (chat, system, ...); only which prompts changes
    node.suite.name = kind.suite or kind.name
    node.suite.path = kind.path
    node.suite.format = kind.format
    node.suite.per_category = kind.per_category
    if kind.format == "spec-bench":
        node.limit = None  # prompts.per_category draws from every task; a limit would cut whole tasks off
    node.fixed_ks = list(fixed_ks) or None
    node.results = str(results)
    node.resume = True
    plain = cast(dict, OmegaConf.to_container(node, resolve=True))
    for key in TUNE_KEYS:
        plain.pop(key, None)
    plain.pop("hydra", None)
    return OmegaConf.create(plain)


def config_hash_of(node: DictConfig) -> str:
    """The hash run_bench files this measurement's records under (records.config_hash of its snapshot)."""
    from specpipe.bench.records import config_hash

    snapshot = cast(dict, OmegaConf.to_container(node, resolve=True))
    snapshot.pop("hydra", None)
    return config_hash(snapshot)
