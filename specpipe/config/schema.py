"""Typed schemas for every config group, registered in Hydra's ConfigStore.

Each `conf/<group>/<option>.yaml` names its schema first in its defaults
list, so a wrong type or an unknown key fails when the config is composed,
before any model loads. Schemas hold types only (`MISSING`): every value
lives in the YAML, one source per default (tests/test_plugins.py). A field
declared with `ranged(low, high, advice)` carries its range as metadata,
which preflight.py checks before anything loads; range checks that need
logic live in the plug-in constructors (they raise SpecpipeError).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


class Range(NamedTuple):
    """The values a numeric field takes, read by preflight.py before anything loads (metadata, not a default)."""

    low: float | None = None
    high: float | None = None
    advice: str = ""
    low_open: bool = False  # low itself is refused
    high_open: bool = False


def ranged(low: float | None, high: float | None, advice: str, **open_ends: bool) -> Any:
    """A schema field with no value (the YAML holds it) and the range preflight checks it against."""
    return field(default=MISSING, metadata={"range": Range(low, high, advice, **open_ends)})


@dataclass
class ModelConfig:
    name: str | None = MISSING  # packaged name or "tiny-random"
    path: str | None = MISSING  # GGUF file / model folder / HF-cache repo id; wins over name
    arch: str = MISSING  # tiny-random only: any mlx-lm model_type
    seed: int = MISSING  # tiny-random only: weight seed
    tiny: dict[str, Any] = MISSING  # tiny-random only: +model.tiny.hidden_size=256


@dataclass
class QuantConfig:
    precision: str = MISSING  # auto | stored | float32 | bfloat16 | float16 | mlx4 | mlx8


@dataclass
class PluginConfig:
    _target_: str = MISSING
    _partial_: bool = True
    name: str = MISSING


@dataclass
class NoneDraftConfig(PluginConfig):
    pass


@dataclass
class NgramDraftConfig(PluginConfig):
    min_n: int = MISSING
    max_n: int = MISSING
    window: int | None = MISSING  # matches start within the last `window` tokens; None: the whole context


@dataclass
class SuffixDraftConfig(PluginConfig):
    min_n: int = ranged(1, 64, "the shortest match drafted from, e.g. 1")
    max_n: int = ranged(1, 64, "the longest match (the trie's depth), e.g. 16")
    spec_factor: float = MISSING  # a draft is at most spec_factor x its first match's length
    min_prob: float = MISSING  # stop where the branch's estimated probability falls below this
    store_tokens: int = ranged(0, None, "tokens of earlier requests kept, e.g. 200000")
    store_file: str | None = MISSING  # keep the history in this JSON file across runs; None: in memory only


@dataclass
class LookaheadDraftConfig(PluginConfig):
    window: int = MISSING  # Jacobi window: positions guessed ahead, fed as one tree branch
    ngram: int = MISSING  # n of the n-grams gathered from the window's iterations
    pool: int = MISSING  # n-grams kept per first token
    seed: int = MISSING  # the window's first guesses (prompt tokens drawn at random)


@dataclass
class ModelDraftConfig(PluginConfig):
    model: str | None = MISSING  # packaged name, or "self" to draft with the target; None: draft.path
    path: str | None = MISSING
    quant: str | None = MISSING  # None: same precision as the target
    lookup_min_n: int | None = MISSING  # prompt lookup first where this many tokens match (0: model only; null: auto)
    vocab: int | None = MISSING  # draft head rows: the `vocab` most used ids + the context's; 0: all; null: 32768
    vocab_map: str = MISSING  # another tokenizer: auto | intersection | text (drafters/cross_vocab.py)
    # the recent prompt tokens the draft prefills and keeps (drafters/draft_window.py); null: the whole prompt
    context: int | None = ranged(1, None, "recent tokens the draft reads, e.g. draft.context=256; null: all")
    sinks: int = ranged(0, None, "first tokens the draft keeps beside draft.context's window, e.g. 4")


@dataclass
class ChainDraftConfig(PluginConfig):
    sources: list[str] = MISSING  # drafters asked in order until one proposes: ngram, model, layerskip, ...
    probe_every: int = ranged(1, None, "ask a skipped source once after this many skips, e.g. 16")
    # each source's own node (conf/draft/<name>.yaml), used when `sources` names it
    ngram: Any = MISSING
    model: Any = MISSING
    layerskip: Any = MISSING
    mtp: Any = MISSING
    lookahead: Any = MISSING
    eagle3: Any = MISSING
    suffix: Any = MISSING


@dataclass
class FixedBudgetConfig(PluginConfig):
    k: int = MISSING


@dataclass
class AdaptiveBudgetConfig(PluginConfig):
    k: int = MISSING  # starting K
    k_min: int = MISSING
    k_max: int = MISSING


@dataclass
class ConfidenceBudgetConfig(PluginConfig):
    k: int = MISSING  # most tokens per draft
    p_min: float = MISSING  # stop drafting below this top probability


@dataclass
class AutoBudgetConfig(PluginConfig):
    k_max: int = MISSING
    probe_every: int = MISSING  # while plain decoding wins, re-check acceptance after this many steps
    probe_max: int = MISSING  # each probe that leaves K at 0 doubles the wait, up to this
    probe_k: int = MISSING
    forget: float = MISSING  # acceptance memory per step
    # the prior acceptance rate: Beta(2a, 2(1-a)) needs 0 < a < 1 (-1 made complex numbers, 1e300 a 0 division)
    prior_alpha: float = ranged(0, 1, "the prior acceptance rate, e.g. 0.5", low_open=True, high_open=True)
    quick: bool = MISSING  # calibrate 7 points (vs 33) when the device has no cached curve
    # drafting that returned under this share of plain's speed stops, but for probes
    loss_margin: float = ranged(0, 1, "a share of plain's speed, e.g. 0.97", low_open=True)
    # a longer draft testing a thin continuation may be priced this share of the best one
    explore_cost: float = ranged(0, 1, "a share of the best draft's speed-up, e.g. 0.9", low_open=True)
    draft_prefill: str | None = MISSING  # full | window | none | chunked; None: priced per request
    prefill_window: int = ranged(1, None, "prompt tokens a windowed draft reads, e.g. 256")
    prefill_sinks: int = ranged(0, None, "first tokens kept beside the window, e.g. 4")
    window_keeps: float = ranged(0, 1, "the share of the saving a window keeps, e.g. 0.5", low_open=True)
    prefill_chunk_steps: float = ranged(0, None, "target steps of draft prefill per chunk, e.g. 1.0; 0: none")


@dataclass
class TrimRollbackConfig(PluginConfig):
    pass


@dataclass
class CompareConfig(PluginConfig):
    pass


@dataclass
class SamplingConfig:
    temperature: float = MISSING
    top_k: int = MISSING
    top_p: float = MISSING
    min_p: float = MISSING
    seed: int = MISSING


@dataclass
class PromptConfig:
    text: str = MISSING
    chat: bool = MISSING  # wrap in the model's chat template when it has one
    system: str | None = MISSING


@dataclass
class ChainTreeConfig:
    name: str = MISSING  # chain (one branch) | static | dynamic  (specpipe/trees/shape.py)


@dataclass
class SizedTreeConfig(ChainTreeConfig):
    # budget=auto's tree sizer (trees/budget.py): the predicted gain over a plain step a verify must beat, and the
    # gain below which the choice hangs on T(1) (a plain step times it first)
    min_gain: float = ranged(0.0, 1.0, "predicted speed-up over plain a tree verify must beat, e.g. 0.03")
    thin_gain: float = ranged(0.0, 1.0, "below this predicted gain a plain step times T(1) first, e.g. 0.10")


@dataclass
class StaticTreeConfig(SizedTreeConfig):
    branching: list[int] = MISSING  # children per kept node, by depth


@dataclass
class DynamicTreeConfig(SizedTreeConfig):
    nodes: int = ranged(1, 64, "nodes verified per step, trees/shape.py MAX_NODES")
    depth: int = ranged(1, 64, "the deepest level drafted")
    # alternatives a model drafter scores per depth (0 broke a reshape; more than the nodes are never verified)
    width: int = ranged(1, 64, "alternatives scored per depth, e.g. tree.width=4")


@dataclass
class PrefillConfig:
    chunk: int = MISSING  # prompt positions per prefill forward (activation memory grows with it)
    progress_tokens: int = MISSING  # the CLI draws a progress bar on a terminal for prompts at least this long


@dataclass
class PrefixCacheConfig:
    """The prefix store (specpipe/prefix/, docs/prefix_cache.md): a prompt's longest stored prefix is reused."""

    enabled: bool = MISSING  # on for the chat and the server; off for bench and tune (a repeat would reuse)
    bytes: int = ranged(0, None, "the bytes of cache snapshots kept, e.g. 1073741824 (1 GiB)")


@dataclass
class BlasConfig:
    # OpenBLAS threads; null: the cores other processes leave free at start (engine/load/blas.py). Read from
    # the command line before Hydra composes (the BLAS loads before MLX), kept here so the snapshot has it
    threads: int | None = MISSING


@dataclass
class PipelineGroups:
    """The groups every app composes (specpipe, specpipe-bench, specpipe-chat)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    draft: Any = MISSING
    quant: QuantConfig = field(default_factory=QuantConfig)
    budget: Any = MISSING
    rollback: Any = MISSING
    compare: Any = MISSING
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    tree: Any = MISSING
    kv: Any = MISSING  # engine/kv.py: full | quantized | window
    prefill: PrefillConfig = field(default_factory=PrefillConfig)
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    blas: BlasConfig = field(default_factory=BlasConfig)


@dataclass
class SpecpipeConfig(PipelineGroups):
    prompt: PromptConfig = field(default_factory=PromptConfig)
    max_tokens: int = MISSING
    stream: bool = MISSING  # print text as it is generated
    output_dir: str | None = MISSING  # None: Hydra's run folder


@dataclass
class CalibrateConfig(SpecpipeConfig):
    """specpipe-calibrate: the run's groups plus what to time."""

    quick: bool = MISSING  # 7 verify lengths instead of 33 (slow devices, big models)
    contexts: bool = MISSING  # also the curves at long contexts (1k-16k cached positions)
    check: bool = MISSING  # a short measured check beside the prediction (costmodel/check.py)
    check_tokens: int = ranged(1, 4096, "tokens per check run, e.g. 48")


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="specpipe_schema", node=SpecpipeConfig)
    cs.store(name="calibrate_schema", node=CalibrateConfig)
    cs.store(group="schema/model", name="model", node=ModelConfig)
    cs.store(group="schema/quant", name="quant", node=QuantConfig)
    cs.store(group="schema/draft", name="none", node=NoneDraftConfig)
    cs.store(group="schema/draft", name="ngram", node=NgramDraftConfig)
    cs.store(group="schema/draft", name="suffix", node=SuffixDraftConfig)
    cs.store(group="schema/draft", name="model", node=ModelDraftConfig)
    cs.store(group="schema/draft", name="lookahead", node=LookaheadDraftConfig)
    cs.store(group="schema/draft", name="chain", node=ChainDraftConfig)
    cs.store(group="schema/budget", name="fixed", node=FixedBudgetConfig)
    cs.store(group="schema/budget", name="adaptive", node=AdaptiveBudgetConfig)
    cs.store(group="schema/budget", name="confidence", node=ConfidenceBudgetConfig)
    cs.store(group="schema/budget", name="auto", node=AutoBudgetConfig)
    cs.store(group="schema/rollback", name="trim", node=TrimRollbackConfig)
    cs.store(group="schema/compare", name="compare", node=CompareConfig)
    cs.store(group="schema/sampling", name="sampling", node=SamplingConfig)
    cs.store(group="schema/prompt", name="prompt", node=PromptConfig)
    cs.store(group="schema/tree", name="chain", node=ChainTreeConfig)
    cs.store(group="schema/tree", name="static", node=StaticTreeConfig)
    cs.store(group="schema/tree", name="dynamic", node=DynamicTreeConfig)


register()


# ---------------------------------------------------------------- benchmark (specpipe-bench)
# bench.yaml reuses the groups above (no `prompt`: prompts come from a suite).


@dataclass
class SuiteConfig:
    name: str = MISSING  # packaged suite: specpipe/bench/suites/<name>.jsonl
    path: str | None = MISSING  # a JSONL file of {"id", "prompt"} lines; wins over name
    chat: bool = MISSING  # wrap prompts in the model's chat template
    system: str | None = MISSING
    format: str = MISSING  # jsonl ({"id", "prompt"} lines) | spec-bench (Spec-Bench's question.jsonl, first turns)
    per_category: int | None = MISSING  # spec-bench: this many questions per category, evenly spaced (None: all)
    second_turns: bool = MISSING  # spec-bench: MT-Bench's second turns too, with the first answer in the context


@dataclass
class BenchConfig(PipelineGroups):
    suite: SuiteConfig = field(default_factory=SuiteConfig)
    max_tokens: int = MISSING
    limit: int | None = MISSING  # first N prompts of the suite; None: all
    warmup: bool = MISSING  # one untimed short run of every path before measuring
    anchor: bool = MISSING  # also run mlx-lm's own generation on the same model objects
    # mlx-lm's num_draft_tokens values to sweep per prompt (draft=model only); None: the budget's k alone.
    # The report then shows each K and mlx-lm's best, chosen over the whole suite, not per prompt.
    anchor_ks: list[int] | None = MISSING
    resume: bool = MISSING  # skip (config hash, prompt id) pairs already in the results file
    results: str | None = MISSING  # results JSONL; None: <sweep or run dir>/bench.jsonl
    repeats: int = MISSING  # each prompt's baseline / speculative pair this many times; the median run of each is kept
    # specpipe's own fixed K values to measure beside the configured budget (same drafter, same baseline runs);
    # the verdict line compares the budget (e.g. auto) with the best of them and with mlx-lm's best K.
    fixed_ks: list[int] | None = MISSING


def register_bench() -> None:
    cs = ConfigStore.instance()
    cs.store(name="bench_schema", node=BenchConfig)
    cs.store(group="schema/suite", name="suite", node=SuiteConfig)


register_bench()


# ---------------------------------------------------------------- rollback strategies for recurrent / hybrid models


@dataclass
class CheckpointRollbackConfig(PluginConfig):
    pass


@dataclass
class RecomputeRollbackConfig(PluginConfig):
    pass


@dataclass
class AutoRollbackConfig(PluginConfig):
    max_snapshot_mb: float = MISSING  # per model: above this a step recomputes instead of checkpointing


def register_rollbacks() -> None:
    cs = ConfigStore.instance()
    cs.store(group="schema/rollback", name="checkpoint", node=CheckpointRollbackConfig)
    cs.store(group="schema/rollback", name="recompute", node=RecomputeRollbackConfig)
    cs.store(group="schema/rollback", name="auto", node=AutoRollbackConfig)


register_rollbacks()


# ---------------------------------------------------------------- drafters without a second model, head training


@dataclass
class LayerSkipDraftConfig(PluginConfig):
    depth: int | None = MISSING  # draft with layers [0, depth) of the target
    layers: list[int] | None = MISSING  # explicit layer indices; wins over depth


@dataclass
class MtpDraftConfig(PluginConfig):
    head: str | None = MISSING  # head folder / checkpoint folder; None: the model's own or the trained one next to it


@dataclass
class Eagle3DraftConfig(PluginConfig):
    path: str | None = MISSING  # the head's folder (or a Hugging Face id in the local cache); required
    layers: list[int] | None = MISSING  # target layers whose inputs are tapped; None: the head's, else (2, N//2, N-3)


@dataclass
class Gemma4AssistantDraftConfig(PluginConfig):
    path: str | None = MISSING  # the assistant's checkpoint folder (config.json + *.safetensors); required


@dataclass
class DFlashDraftConfig(PluginConfig):
    path: str | None = MISSING  # the DFlash drafter's folder (or a Hugging Face id in the local cache); required
    proposal: str = MISSING  # under sampling: sample (each position from its q) | argmax (each position's best)


@dataclass
class TrainDrafterConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    kind: str = MISSING  # mtp | eagle3 (specpipe/train/eagle3.py)
    draft_vocab: int = MISSING  # kind=eagle3: ids in the head's draft vocabulary (the target's most frequent)
    layers: list[int] | None = MISSING  # kind=eagle3: tapped layers; None: (2, N//2, N-3)
    corpus: str | None = MISSING  # folder or text file; None: Python's stdlib + installed packages
    out: str | None = MISSING  # head folder; None: next to the model (where draft=mtp looks)
    sequences: int = MISSING  # corpus size in seq_len-token sequences (target hidden states are precomputed once)
    answers: float = MISSING  # share of sequences that are the target's own chat answers to tasks cut from the corpus
    steps: int = MISSING
    batch: int = MISSING
    seq_len: int = MISSING
    chunk: int = MISSING  # sequences per chunk of precomputed target hidden states
    unroll: int = MISSING  # chained head steps trained per position
    ce_positions: int = MISSING  # positions per step that also get cross-entropy through the full LM head
    ce_weight: float = MISSING
    lr: float = MISSING
    warmup: int = MISSING
    seed: int = MISSING
    resume: bool = MISSING  # continue from out/train_state when present
    save_every: int = MISSING
    max_files: int = MISSING


def register_drafters_extra() -> None:
    cs = ConfigStore.instance()
    cs.store(group="schema/draft", name="layerskip", node=LayerSkipDraftConfig)
    cs.store(group="schema/draft", name="mtp", node=MtpDraftConfig)
    cs.store(group="schema/draft", name="eagle3", node=Eagle3DraftConfig)
    cs.store(group="schema/draft", name="gemma4_assistant", node=Gemma4AssistantDraftConfig)
    cs.store(group="schema/draft", name="dflash", node=DFlashDraftConfig)
    cs.store(name="train_drafter_schema", node=TrainDrafterConfig)


register_drafters_extra()


# ---------------------------------------------------------------- KV cache policies (kv=...)


@dataclass
class FullKvConfig(PluginConfig):
    pass


@dataclass
class QuantizedKvConfig(PluginConfig):
    bits: int = MISSING  # 4 | 8
    group_size: int = MISSING  # 32 | 64 | 128: must divide the model's head size


@dataclass
class WindowKvConfig(PluginConfig):
    size: int = MISSING  # each position attends to the last `size` positions


def register_kv() -> None:
    cs = ConfigStore.instance()
    cs.store(group="schema/kv", name="full", node=FullKvConfig)
    cs.store(group="schema/kv", name="quantized", node=QuantizedKvConfig)
    cs.store(group="schema/kv", name="window", node=WindowKvConfig)


register_kv()


# ---------------------------------------------------------------- --help

APPS = {
    "config": "specpipe",
    "bench": "specpipe-bench",
    "train_drafter": "specpipe-train-drafter",
    "serve": "specpipe-serve",
}


def help_groups(primary: str) -> str:
    """`group: option, ...` lines for the groups `primary`'s defaults list uses (schemas stay hidden), each
    followed by a `group (yours, in <folder>): ...` line where the user's config folder holds options of it.

    Hydra's own $APP_CONFIG_GROUPS also lists the schema/* groups registered above.
    """
    from importlib import resources

    import yaml

    conf = resources.files("specpipe.conf")
    defaults = yaml.safe_load(conf.joinpath(f"{primary}.yaml").read_text()).get("defaults", [])
    groups = [next(iter(d)) for d in defaults if isinstance(d, dict)]
    from specpipe.config.user_config import user_config_dir, user_options

    lines = []
    for group in sorted(g for g in groups if g != "hydra"):
        options = sorted(p.name[:-5] for p in conf.joinpath(group).iterdir() if p.name.endswith(".yaml"))
        lines.append(f"{group}: {', '.join(options)}")
        # the user's own (specpipe-tune's presets), from the search path's folder; a packaged name wins over one
        mine = [f"{m} (hidden by the packaged {m}: rename it)" if m in options else m for m in user_options(group)]
        if mine:
            lines.append(f"{group} (yours, in {user_config_dir() / group}): {', '.join(mine)}")
    return "\n".join(lines)


def register_help_resolvers() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("specpipe_groups", help_groups, replace=True)
    OmegaConf.register_new_resolver("specpipe_app", app_name, replace=True)
    from specpipe.cli.usage import usage

    OmegaConf.register_new_resolver("specpipe_usage", usage, replace=True)
    from specpipe.run.run_folder import fresh_dir_resolver

    OmegaConf.register_new_resolver("specpipe_fresh_dir", fresh_dir_resolver, replace=True)
    from specpipe.config.user_config import search_path

    # every primary config's hydra.searchpath: the presets specpipe-tune wrote (specpipe/config/user_config.py)
    OmegaConf.register_new_resolver("specpipe_user_conf", search_path, replace=True)


def app_name(primary: str) -> str:
    """The console script's name (specpipe-chat and -calibrate share the main config), else by config."""
    import sys
    from pathlib import Path

    from specpipe.run import run_folder

    if run_folder.tool_name():  # the command hydra_main runs, however it was started (python -m ...)
        return run_folder.tool_name()
    script = Path(sys.argv[0]).name
    return script if script.startswith("specpipe") else APPS.get(primary, "specpipe")


register_help_resolvers()
