"""Checks the composed config can decide alone, run before any model loads
(so they exit 2, like a typo in an override, instead of 1 after a load).

Contract: `check_config(cfg) -> str | None` takes a composed config of any
app (specpipe, specpipe-bench, specpipe-train-drafter) and returns one
actionable line for the first problem, or None. It refuses a `_target_` that
is not one of specpipe's own plug-in classes (plugin_targets.py) before any
other check imports one, and catches keys the schema
does not have (`+budget.kk=3`) or a model-free plug-in's constructor does
not take (Session checks the others' before loading), numbers that are not finite, seeds outside
0..2^64-1, out-of-range counts, sampling values, budgets, and prompt text
that is not valid Unicode. It never loads a model or touches a file.
"""

from __future__ import annotations

import dataclasses
import math
from typing import cast

from omegaconf import DictConfig, OmegaConf

from specpipe.errors import SpecpipeError

SEED_MAX = 2**64 - 1  # mlx.random.key takes an unsigned 64-bit seed

# key -> (lowest allowed, highest allowed or None, what to do): counts whose range needs no model
RANGES = {
    "max_tokens": (1, None, "ask for at least one token"),
    "limit": (1, None, "give a number of prompts, or leave it null for all"),
    "repeats": (1, None, "measure each prompt at least once (repeats=1, or 3 on a noisy machine)"),
    "sequences": (1, None, "train on at least one sequence"),
    "steps": (1, None, "train for at least one step"),
    "batch": (1, None, "use at least one sequence per step"),
    "seq_len": (4, None, "use sequences of at least 4 tokens"),
    "chunk": (1, None, "precompute at least one sequence per chunk"),
    "unroll": (1, None, "train at least one chained step"),
    "ce_positions": (1, None, "sample at least one position for cross-entropy"),
    "ce_weight": (0, None, "use a weight of 0 or more"),
    "lr": (0, None, "use a positive learning rate"),
    "warmup": (0, None, "use 0 or more warm-up steps"),
    "save_every": (1, None, "checkpoint every 1 or more steps"),
    "max_files": (1, None, "read at least one file"),
    "answers": (0, 1, "give the share of answer sequences, 0.0..1.0"),
    "draft.window": (1, None, "look back over at least one token"),
    "prefill.chunk": (1, None, "feed at least one prompt token per prefill forward (prefill.chunk=512)"),
    "prefill.progress_tokens": (0, None, "give a prompt length in tokens (0: a bar for every prompt)"),
    "kv.size": (1, None, "give the window in positions, e.g. kv.size=4096"),
    "draft.depth": (1, None, "draft with at least one layer"),
    "draft.vocab": (0, None, "0 (every id) or the number of most frequent ids the draft head scores, e.g. 32768"),
    "draft.lookup_min_n": (0, 64, "0 (no prompt lookup) or the shortest match to draft from, 1..64 (3 suits code)"),
    "rollback.max_snapshot_mb": (0, None, "give a size in MiB, 0 or more"),
}


def check_config(cfg: DictConfig) -> str | None:
    """The first problem the config alone shows, as one line; None when there is none."""
    for check in (
        _targets,
        _unknown_keys,
        _numbers,
        _ranges,
        _schema_ranges,
        _tiny,
        _sampling,
        _plugins,
        _chain,
        _confidence,
        _prompt,
        _draft_model,
    ):
        message = check(cfg)
        if message:
            return message
    return None


def check_text(text: str | None, key: str) -> str | None:
    """A message when `text` holds bytes that are not UTF-8 (argv decodes them to lone surrogates)."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start].encode("utf-8", "surrogateescape")
        return (
            f"{key} has bytes that are not UTF-8 (byte {bad!r} at character {exc.start}): "
            "re-encode the text as UTF-8 (e.g. iconv -t UTF-8)"
        )
    return None


def check_overrides_text(overrides: list[str]) -> str | None:
    """Non-UTF-8 bytes in an override (Hydra's lexer would answer with a grammar error)."""
    for override in overrides:
        message = check_text(override, f"the override {override.split('=', 1)[0]}")
        if message:
            return message
    return None


# ---------------------------------------------------------------- checks


def _targets(cfg: DictConfig) -> str | None:
    """First, before any check imports a plug-in: every `_target_` must be one of specpipe's own classes."""
    from specpipe.config.plugin_targets import check_targets

    return check_targets(cfg)


def _unknown_keys(cfg: DictConfig, prefix: str = "") -> str | None:
    """`+group.key=value` adds keys Hydra does not check; a typed node must know every key it holds."""
    schema = OmegaConf.get_type(cfg)
    if dataclasses.is_dataclass(schema):
        known = {f.name for f in dataclasses.fields(schema)}
        for key in map(str, cfg.keys()):
            if key not in known:
                options = ", ".join(sorted(k for k in known if not k.startswith("_")))
                return (
                    f"unknown config key '{prefix}{key}': check the spelling; "
                    f"{prefix.rstrip('.') or 'the top level'} has {options}"
                )
    for key in map(str, cfg.keys()):
        if OmegaConf.is_missing(cfg, key):
            continue
        node = cfg[key]
        if isinstance(node, DictConfig):
            message = _unknown_keys(node, f"{prefix}{key}.")
            if message:
                return message
    return None


def _leaves(cfg, prefix: str = ""):
    """(dotted key, value) for every resolved leaf."""
    items = cfg.items() if isinstance(cfg, dict) else enumerate(cfg)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            yield from _leaves(value, name + ".")
        else:
            yield name, value


def _plain(cfg: DictConfig) -> dict:
    return cast(dict, OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False))


def _numbers(cfg: DictConfig) -> str | None:
    for key, value in _leaves(_plain(cfg)):
        if isinstance(value, float) and not math.isfinite(value):
            return f"{key}={value} is not a finite number: give a plain value (e.g. {key}=0.5)"
        if key.split(".")[-1] == "seed" and isinstance(value, int) and not 0 <= value <= SEED_MAX:
            return f"{key}={value} is out of range: seeds are 0..{SEED_MAX} (2^64 - 1)"
    return None


def _ranges(cfg: DictConfig) -> str | None:
    for key, (low, high, advice) in RANGES.items():
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value < low or (high is not None and value > high) or (key == "lr" and value == 0):
            return f"{key}={value} is out of range: {advice}"
    if "seq_len" in cfg and "unroll" in cfg and cfg.seq_len <= cfg.unroll + 1:
        return f"seq_len={cfg.seq_len} with unroll={cfg.unroll}: need seq_len > unroll + 1"
    return None


def _schema_ranges(cfg: DictConfig, prefix: str = "") -> str | None:
    """Every field whose schema declares a `Range` (config.ranged): the value must lie inside it."""
    from specpipe.config.schema import Range

    schema = OmegaConf.get_type(cfg)
    fields = dataclasses.fields(schema) if dataclasses.is_dataclass(schema) else ()
    for f in fields:
        bounds = f.metadata.get("range")
        if not isinstance(bounds, Range) or f.name not in cfg or OmegaConf.is_missing(cfg, f.name):
            continue
        value = cfg[f.name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        low_bad = bounds.low is not None and (value <= bounds.low if bounds.low_open else value < bounds.low)
        high_bad = bounds.high is not None and (value >= bounds.high if bounds.high_open else value > bounds.high)
        if low_bad or high_bad:
            key = f"{prefix}{f.name}"
            return f"{key}={value} is out of range: give {_interval(bounds, key)} ({bounds.advice})"
    for key in map(str, cfg.keys()):
        if not OmegaConf.is_missing(cfg, key) and isinstance(cfg[key], DictConfig):
            message = _schema_ranges(cfg[key], f"{prefix}{key}.")
            if message:
                return message
    return None


def _interval(bounds, key: str) -> str:
    """Range(0, 1, low_open=True) -> "0 < key <= 1"."""
    parts = []
    if bounds.low is not None:
        parts.append(f"{bounds.low:g} {'<' if bounds.low_open else '<='} ")
    parts.append(key)
    if bounds.high is not None:
        parts.append(f" {'<' if bounds.high_open else '<='} {bounds.high:g}")
    return "".join(parts)


# The tiny model's byte tokenizer: 256 bytes + 3 specials (engine/load/tiny.py VOCAB_SIZE; not imported
# here, that module imports MLX). A smaller vocabulary made embedding lookups read past the table.
TINY_VOCAB = 259
TINY_COUNTS = ("_size", "_layers", "_heads", "_dim", "_embeddings")


def _tiny(cfg: DictConfig) -> str | None:
    """model=tiny-random's +model.tiny.* sizes: counts are at least 1, the vocabulary fits the tokenizer."""
    model = cfg.get("model") if "model" in cfg else None
    if not isinstance(model, DictConfig) or model.get("name") != "tiny-random" or model.get("path"):
        return None
    tiny = model.get("tiny") if not OmegaConf.is_missing(model, "tiny") else None
    for key, value in (tiny or {}).items():
        key = str(key)
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if key == "vocab_size" and value < TINY_VOCAB:
            return (
                f"model.tiny.vocab_size={value} is out of range: the tiny model's byte tokenizer has "
                f"{TINY_VOCAB} tokens; give at least {TINY_VOCAB}"
            )
        if (key.startswith("num_") or key.endswith(TINY_COUNTS)) and value < 1:
            return f"model.tiny.{key}={value} is out of range: a size or count, at least 1"
    from specpipe.config.size_bounds import check_sizes

    # +model.tiny.hidden_size=1e9 / vocab_size=1e8 built arrays MLX could not hold (a segfault)
    message = check_sizes(OmegaConf.to_container(tiny) if tiny else {}, "model.tiny")
    return message.replace("model.tiny: ", "model.tiny.") if message else None


def _sampling(cfg: DictConfig) -> str | None:
    if "sampling" not in cfg:
        return None
    from specpipe.core.sampling import check_sampling

    s = cfg.sampling
    return check_sampling(s.temperature, s.top_k, s.top_p, s.min_p)


# Plug-ins built here to run their own checks (ranges, unknown keys): they need no model and their modules
# import no MLX. The others' keys are checked by Session before it loads a model: importing mlx-lm here
# would cost ~2 s before the CLI claims its run folder.
MODEL_FREE = (
    "specpipe.budgets.",
    "specpipe.drafters.ngram.",
    "specpipe.drafters.none.",
    "specpipe.drafters.lookahead.",
)


def _plugins(cfg: DictConfig) -> str | None:
    """Build the model-free plug-ins (budgets, n-gram, none): their constructors check their options."""
    from specpipe.plugins import build_plugin

    for group in ("budget", "draft", "kv"):
        node = cfg.get(group) if group in cfg else None
        if not isinstance(node, DictConfig) or not str(node.get("_target_", "")).startswith(MODEL_FREE):
            continue
        try:
            build_plugin(node, group)
        except SpecpipeError as exc:
            return str(exc)
    return None


def _chain(cfg: DictConfig) -> str | None:
    """draft=chain's sources: known drafters, each once, never a chain (drafters/sources.py; imports no MLX)."""
    draft = cfg.get("draft") if "draft" in cfg else None
    if not isinstance(draft, DictConfig) or draft.get("name") != "chain":
        return None
    from specpipe.drafters.sources import check_sources

    tree = cfg.tree.get("name") if isinstance(cfg.get("tree"), DictConfig) else "chain"
    return check_sources(OmegaConf.to_container(draft.sources) if "sources" in draft else None, tree)


NO_DRAFT_MODEL = (
    "draft=model needs the model that drafts: draft.model=<packaged name, e.g. qwen2.5-coder-0.5b> or "
    "draft.path=<file.gguf|folder> (draft.model=self, the target drafting for itself, is only a self-test)"
)


def _draft_model(cfg: DictConfig) -> str | None:
    """draft=model without a draft model used to draft with the target itself (~0.7x): refused instead."""
    draft = cfg.get("draft") if "draft" in cfg else None
    if not isinstance(draft, DictConfig) or draft.get("name") != "model":
        return None
    return NO_DRAFT_MODEL if not draft.get("model") and not draft.get("path") else None


def _confidence(cfg: DictConfig) -> str | None:
    """budget=confidence needs a drafter that takes p_min (imports that drafter's module, loads nothing)."""
    if "budget" not in cfg or "draft" not in cfg:
        return None
    from specpipe.plugins import confidence_mismatch

    return confidence_mismatch(cfg)


def _prompt(cfg: DictConfig) -> str | None:
    for key in ("prompt.text", "prompt.system", "suite.system"):
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if isinstance(value, str):
            message = check_text(value, key)
            if message:
                return message
    return None
