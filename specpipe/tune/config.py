"""The schema of conf/tune.yaml: the bench's groups and keys plus what to tune over.

Registered on import (specpipe/tune/cli.py imports it before Hydra composes, as specpipe/serve/config.py
does for the server), so a typo in a tune key fails at compose time like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from specpipe.config.schema import BenchConfig


@dataclass
class TunePromptsConfig:
    file: str | None = (
        MISSING  # your prompts: a .jsonl of {"id", "prompt"}, or text with prompts split by `---` lines; "-": stdin
    )
    kind: str = MISSING  # the task kind they are, named in the verdict
    format: str = MISSING  # jsonl | text | spec-bench (Spec-Bench's question.jsonl: one verdict per task)
    per_category: int | None = MISSING  # spec-bench: this many questions of each task (None: all)


@dataclass
class TuneConfig(BenchConfig):
    drafts: list[str] = MISSING  # candidates: ngram | model:<name> | layerskip:<depth> | mtp | lookahead | <any>/tree
    suites: list[str] = MISSING  # packaged suites, one task kind each
    prompts: TunePromptsConfig = field(default_factory=TunePromptsConfig)
    ks: list[int] = MISSING  # the first fixed K values, beside budget=auto
    widen_to: list[int] = MISSING  # longer K, each tried only where the last held
    widen_at: float = MISSING  # acceptance over the last half of the longest K's drafts that warrants a longer K
    pays_at: float = MISSING  # a speed-up below this is "does not pay": noise on a shared machine is ~5%
    save_as: str = MISSING  # the preset's name: <user config dir>/preset/<name>.yaml, then preset=<name>
    fresh: bool = MISSING  # start over instead of skipping the measurements already in the results file


def register_tune() -> None:
    cs = ConfigStore.instance()
    cs.store(name="tune_schema", node=TuneConfig)
    cs.store(group="schema/tune", name="prompts", node=TunePromptsConfig)


register_tune()
