"""A Session: models and plug-ins built once from a config, then any number
of generations (CLI runs one, the TUI one per chat turn, the benchmark one
per prompt).

Contract: `Session(cfg)` loads and validates everything (SpecpipeError on
bad input); `generate(prompt_ids)` yields the pipeline's events, starting
with RunStarted and ending with RunFinished. The session owns one prefix
store (`prefix_store`, specpipe/prefix/; None with prefix_cache.enabled
false): every generation starts from it and keeps its prompt and answer
there, and the server's batch hands it to its BatchDecoder.
"""

from __future__ import annotations

import sys
from collections.abc import Generator

from omegaconf import DictConfig, OmegaConf

from specpipe.config.preflight import check_text
from specpipe.core.protocols import Bonus, Budget, Comparator, Drafter, Rollback
from specpipe.core.sampling import Sampler
from specpipe.core.stages.bonus import GreedyBonus, SampledBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.drafters.suffix_store import HistoryShelf
from specpipe.engine.context import check_room
from specpipe.engine.kv import FullKV
from specpipe.errors import ConfigError, SpecpipeError
from specpipe.events import Event, RunStarted
from specpipe.plugins import build_plugin, check_plugins
from specpipe.prefix.store import PrefixStore
from specpipe.run import signals


class Session:
    def __init__(self, cfg: DictConfig, target=None, reuse: bool = True):
        """
        Args:
            cfg: the composed config (specpipe/conf/config.yaml).
            target: an already loaded target Engine to reuse (else loaded from cfg.model).
            reuse: False: no prefix store whatever prefix_cache says (a session that runs one generation).
        """
        from specpipe.engine.load.loader import load_engine, load_target

        check_supported(cfg)
        self.cfg = cfg
        self.budget: Budget = build_plugin(cfg.budget, "budget")  # needs no model: its range checks fail before a load
        self.target = target or load_target(cfg)
        signals.check()  # a stop swallowed inside the load (C code) ends the start here, before the draft loads
        self.kv = build_plugin(cfg.kv, "kv") if cfg.get("kv") else FullKV()
        configure_engine(self.target, self.kv, cfg)

        def load_draft(name=None, path=None, precision=None, keys=("draft.model", "draft.path")):
            engine = load_engine(name, path, precision or cfg.quant.precision, keys=keys)
            return configure_engine(engine, self.kv, cfg)

        s = cfg.sampling
        self.sampler = Sampler(s.temperature, s.top_k, s.top_p, s.min_p, s.seed)
        # budget=confidence's floor reaches the drafter through its constructor (check_supported
        # refused drafters without one)
        floor = {"p_min": self.budget.p_min} if self.budget.p_min > 0 else {}
        # earlier requests' text for draft=suffix: one history per session, shared with the server's rows
        self.history = HistoryShelf()
        self.drafter: Drafter = build_plugin(
            cfg.draft, "draft", target=self.target, load=load_draft, sampler=self.sampler, history=self.history, **floor
        )
        self.budget.prepare(self.target, self.drafter)  # budget=auto calibrates here (timed once per device, cached)
        from specpipe.advice import warnings
        from specpipe.engine.device import device

        self.warnings = warnings(self.target, self.drafter, self.budget, device().get("mlx_device", ""))
        self.rollback: Rollback = build_plugin(cfg.rollback, "rollback")
        self.tree = tree_for(cfg, self.target, self.drafter, self.budget)  # None: chains
        self.comparator: Comparator
        self.bonus: Bonus
        self.comparator, self.bonus = comparator_and_bonus(cfg, self.sampler)
        engine = self.drafter.engine
        self.draft_info = engine.info if engine is not None and engine is not self.target else None
        self.prefix_store = prefix_store_for(cfg, self.target) if reuse else None
        if self.prefix_store is not None and self.drafter.prefix_notice:
            print(f"specpipe: prefix_cache: {self.drafter.prefix_notice}", file=sys.stderr)

    def encode(self, text: str | None = None, messages: list[dict] | None = None) -> list[int]:
        """Prompt ids from the config's prompt, a text, or chat messages."""
        p = self.cfg.prompt
        for value, key in (
            (text, "the prompt"),
            (p.text if text is None and messages is None else None, "prompt.text"),
        ):
            message = check_text(value, key)  # e.g. a prompt file or stdin with non-UTF-8 bytes
            if message:
                raise SpecpipeError(message)
        if messages is not None:
            ids = self.target.encode_messages(messages)
        else:
            ids = self.target.encode_prompt(p.text if text is None else text, p.chat, p.system)
        if not ids:
            raise SpecpipeError("the prompt is empty: give a prompt, e.g. prompt.text='Hello'")
        self.target.check_prompt_fits(len(ids))
        if self.drafter.engine is not None:  # a draft model with a shorter context would fail mid-prefill
            self.drafter.engine.check_prompt_fits(len(ids))
        return ids

    def generate(
        self, prompt_ids: list[int], max_tokens: int | None = None, control=None, prompt_text: str = ""
    ) -> Generator[Event, None, None]:
        """Run the pipeline once; yields RunStarted ... RunFinished."""
        from specpipe.core.pipeline import SpeculativePipeline

        self.sampler.reset()  # same seed, same tokens, every generation
        max_tokens = self.cfg.max_tokens if max_tokens is None else max_tokens
        check_room(self.target, len(prompt_ids), max_tokens)  # before the first forward, not minutes into it
        if self.drafter.engine is not None:  # a draft model with a shorter context would fail mid-run
            check_room(self.drafter.engine, len(prompt_ids), max_tokens)
        started = RunStarted(
            target=self.target.info,
            draft=self.draft_info,
            drafter=self.drafter.label,  # the header's: a chain names its sources (chain[ngram>layerskip])
            budget=self.budget_label(),
            rollback=self.rollback.name,
            compare=self.comparator.name,
            seed=self.sampler.seed,
            prompt_text=prompt_text,
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            config_yaml=OmegaConf.to_yaml(self.cfg, resolve=True),
            tree=self.tree.shape.label() if self.tree is not None else "",
            draft_head_rows=self.drafter.head_rows,
            draft_vocab_map=self.drafter.vocab_map,
            draft_vocab_shared=self.drafter.vocab_shared,
            warnings=self.warnings,
            **self._costs(),
        )
        pipeline = SpeculativePipeline(
            self.target,
            self.drafter,
            self.budget,
            self.comparator,
            self.rollback,
            self.bonus,
            started,
            self.tree,
            prefix_store=self.prefix_store,
        )
        return pipeline.run(prompt_ids, max_tokens, control=control)

    def _costs(self) -> dict:
        """The estimate's costs for RunStarted, so that a consumer of events alone (the chat, a replay)
        prices the run's steps as the CLI's summary does."""
        from specpipe.costmodel.worth import calibrated_costs

        ratio, c = calibrated_costs(self.budget, self.target, self.drafter)
        return {"verify_ratio": ratio, "draft_cost": c}

    def budget_label(self) -> str:
        """e.g. fixed(k=8), adaptive(k=4, k_max=16), confidence(k=16, p_min=0.6), auto(k_max=16)."""
        params = [f"{a}={getattr(self.budget, a)}" for a in self.budget.label_params]
        return f"{self.budget.name}({', '.join(params)})" if params else self.budget.name


def configure_engine(engine, kv, cfg: DictConfig):
    """Give an engine the run's KV cache policy (refused in one line when the model cannot use it)
    and prefill chunk; returns it."""
    kv.check(engine)  # before the policy is set: check() looks at the model's own caches
    engine.kv = kv
    engine.prefill_chunk = cfg.prefill.chunk if cfg.get("prefill") else engine.prefill_chunk
    return engine


def prefix_store_for(cfg: DictConfig, target) -> PrefixStore | None:
    """The session's prefix store (prefix_cache.enabled), bounded by prefix_cache.bytes; None when off."""
    pc = cfg.get("prefix_cache")
    if pc is None or not pc.enabled:
        return None
    if pc.bytes < 0:  # preflight says so first for a CLI run; a config built in code gets the same line
        raise ConfigError(f"prefix_cache.bytes={pc.bytes}: must be 0 or more, e.g. prefix_cache.bytes=1073741824")
    return PrefixStore(int(pc.bytes), target.make_cache)


def comparator_and_bonus(cfg: DictConfig, sampler: Sampler) -> tuple[Comparator, Bonus]:
    """The compare group's comparator and a sampled bonus; at temperature 0 every rule reduces to
    argmax comparison, so greedy ones."""
    if sampler.greedy:
        return GreedyComparator(), GreedyBonus()
    return build_plugin(cfg.compare, "compare", sampler=sampler), SampledBonus(sampler=sampler)


def check_supported(cfg: DictConfig) -> None:
    """Refuse options whose machinery has not landed yet, before loading anything."""
    if cfg.max_tokens < 1:
        raise SpecpipeError(f"max_tokens={cfg.max_tokens}: must be at least 1")
    message = check_plugins(cfg)  # unknown keys of every plug-in, p_min without a drafter that takes it
    if message:
        raise ConfigError(message)
    from specpipe.trees.shape import TreeShape

    shape = TreeShape.from_config(cfg.get("tree"))  # a bad tree shape: ConfigError before anything loads
    if shape is None and cfg.draft.get("name") == "lookahead":
        raise ConfigError(
            "draft=lookahead verifies its Jacobi window as a tree branch: add tree=dynamic (or tree=static)"
        )


def tree_for(cfg: DictConfig, target, drafter, budget=None):
    """The rows' tree parts (specpipe/trees/proposal.py) when tree != chain, else None (chains);
    `budget` sizes each tree (trees/budget.py). Refuses a target or drafter without trees in one line."""
    from specpipe.trees.budget import TreeGains
    from specpipe.trees.proposal import tree_parts
    from specpipe.trees.shape import TreeShape

    shape = TreeShape.from_config(cfg.get("tree"))
    if shape is None or drafter.name == "none":  # nothing drafted: plain decoding, as with tree=chain
        return None
    gains = TreeGains(float(cfg.tree.min_gain), float(cfg.tree.thin_gain))
    return tree_parts(target, drafter, shape, budget, gains)
