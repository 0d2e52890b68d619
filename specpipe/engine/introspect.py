"""What the engine knows of mlx-lm's module structure, in one place.

Contract: given an mlx-lm model, find its inner model (embedding, decoder
layers, final norm), its LM head (or the tied embedding), and the recurrent
mixers that own a cache entry (MIXERS). Everything else (drafters, the
trainer, rollbacks) asks here instead of walking the tree itself. Nothing
here runs a model or changes one.
"""

from __future__ import annotations

import importlib
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specpipe.errors import SpecpipeError

LLAMA_LIKE = "llama, qwen2, qwen3, mistral and other llama-like mlx-lm models"

# mlx_lm.models.<module>: the classes that own a recurrent cache entry. A
# family is listed once its losslessness test passes (tests/test_recurrent.py).
MIXERS: dict[str, tuple[str, ...]] = {
    "qwen3_next": ("Qwen3NextGatedDeltaNet",),  # Gated DeltaNet + conv, hybrid with attention
    "qwen3_5": ("GatedDeltaNet",),  # also serves qwen3_5_moe, which reuses it
    "mamba2": ("Mamba2Block",),
    "nemotron_h": ("NemotronHMamba2Mixer",),
    "falcon_h1": ("FalconH1Mixer",),  # parallel Mamba2 + attention in one CacheList
    "lfm2": ("ShortConv",),
    "mamba": ("MambaBlock",),
    "recurrent_gemma": ("RecurrentBlock",),  # conv + RG-LRU
    "rwkv7": ("Rwkv7TimeMixing", "Rwkv7ChannelMixing"),  # both write slots of one entry
}


# ---------------------------------------------------------------- inner model and LM head


def lm_head_weights(model: nn.Module, inner: nn.Module) -> nn.Module:
    """The module whose weights the LM head reads: `lm_head`, or the tied embedding."""
    model = model.language_model if "language_model" in model else model
    return model.lm_head if "lm_head" in model else inner.embed_tokens


def llama_parts(model: nn.Module, drafter: str) -> tuple[Any, Any]:
    """(inner model with embed_tokens/layers/norm, lm_head callable) of an mlx-lm model.

    `lm_head(inner(ids[None], cache=cache))` is exactly `model(ids[None], cache=cache)`
    for these models: the same two calls mlx-lm's own `Model.__call__` makes.

    Args:
        drafter: who asks (`mtp`, `layerskip`), for the error message.

    Raises:
        SpecpipeError naming the missing piece and what works.
    """
    inner = model.get("model") if isinstance(model, dict) else None
    if inner is None and "language_model" in model:  # Qwen3.5-style wrapper
        inner = model.language_model.get("model")
        model = model.language_model
    missing = [a for a in ("embed_tokens", "layers", "norm") if inner is None or a not in inner]
    if missing:
        raise SpecpipeError(
            f"draft={drafter} needs an mlx-lm llama-like model (model.embed_tokens, model.layers, model.norm); "
            f"{type(model).__module__.rsplit('.', 1)[-1]} has no {', '.join(missing)}: it works on {LLAMA_LIKE}"
        )
    assert inner is not None  # `missing` names it otherwise
    head = model.lm_head if "lm_head" in model else inner.embed_tokens.as_linear
    cap = logit_softcap(model)
    return inner, (_softcapped(head, cap) if cap else head)


def logit_softcap(model: nn.Module) -> float | None:
    """The cap a model squashes its logits with (`tanh(x / cap) * cap`: Gemma-2 / Gemma-4), or None. mlx-lm keeps
    it on the model (gemma2, gemma4_text) or in its args (gear, muse_glimmer)."""
    model = model.language_model if "language_model" in model else model
    cap = getattr(model, "final_logit_softcapping", None)
    if cap is None:
        cap = getattr(getattr(model, "args", None), "final_logit_softcapping", None)
    return float(cap) if cap else None


def _softcapped(head, cap: float):
    """`head` followed by the model's logit soft-capping, the same two ops its own forward runs (bit-equal)."""

    def capped(hidden):
        return mx.tanh(head(hidden) / cap) * cap

    return capped


def cache_layer_types(model: nn.Module) -> list[str] | None:
    """The attention kind ("full_attention" / "sliding_attention") of each cache entry of a model that
    names them per layer (mlx-lm's gemma4 / gemma4_text: `args.layer_types`), else None."""
    model = model.language_model if "language_model" in model else model
    if type(model).__module__ not in KV_SHARING:
        return None  # others may name layer kinds too (llama's sliding layers), but share no K/V a drafter reads
    return list(model.args.layer_types)


KV_SHARING = ("mlx_lm.models.gemma4_text",)  # also mlx_lm's gemma4, whose language_model is this one


def decoder_layers(model: nn.Module, drafter: str) -> list[nn.Module]:
    """The inner model's decoder layers, in order (llama_parts' checks and message)."""
    inner, _ = llama_parts(model, drafter)
    return list(inner.layers)


def layer_view(model: nn.Module, layer_ids: list[int], drafter: str) -> tuple[Any, list[nn.Module], Any, Any]:
    """(embedding, the decoder layers `layer_ids`, final norm, LM head callable): what a model made of
    some of `model`'s own layers calls (draft=layerskip); the modules are shared, never copied."""
    inner, head = llama_parts(model, drafter)
    return inner.embed_tokens, [inner.layers[i] for i in layer_ids], inner.norm, head


def is_full_attention(layer: nn.Module) -> bool:
    """A decoder layer with full attention of its own (a `self_attn`, not a sliding-window one)."""
    return "self_attn" in layer and not getattr(layer, "use_sliding", False)


def last_full_attention(inner: nn.Module) -> tuple[int, nn.Module] | None:
    """(index, layer) of the inner model's last full-attention decoder layer (an MTP block's shape), or None."""
    for i in range(len(inner.layers) - 1, -1, -1):
        if is_full_attention(inner.layers[i]):
            return i, inner.layers[i]
    return None


def final_norm(inner: nn.Module) -> nn.Module:
    """The inner model's final norm (the LM head's input is its output)."""
    return inner.norm


# ---------------------------------------------------------------- recurrent mixers


def mixer_classes() -> tuple[type, ...]:
    """The mlx-lm classes listed in MIXERS (imported on first use)."""
    classes: list[type] = []
    for module, names in MIXERS.items():
        mod = importlib.import_module(f"mlx_lm.models.{module}")
        classes.extend(getattr(mod, name) for name in names)
    return tuple(classes)


def mixer_sites(model: nn.Module) -> list[tuple[object, object, nn.Module]]:
    """Every MIXERS instance in `model`, as (parent, key, mixer) with `parent[key] is mixer`.

    The parent is the module (a dict) or list that holds the mixer, so the
    engine can put a wrapper in the mixer's place for one forward and back.
    """
    classes = mixer_classes()
    sites = []

    def walk(node) -> None:
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            if isinstance(child, classes):
                sites.append((node, key, child))
            elif isinstance(child, (dict, list)):
                walk(child)

    walk(model)
    return sites


def mixer_fraction(model: nn.Module) -> float:
    """Share of `model`'s parameters inside MIXERS: what a per-token state capture re-reads per extra position."""
    from mlx.utils import tree_flatten

    total = sum(v.size for _, v in tree_flatten(model.parameters()))
    mixers = sum(v.size for _, _, m in mixer_sites(model) for _, v in tree_flatten(m.parameters()))
    return mixers / max(total, 1)


def foreign_modules(model: nn.Module) -> list[str]:
    """Paths of modules in `model` that are not mlx's or mlx-lm's own (an engine wrapper left behind).

    Empty for a model exactly as mlx-lm built it: the bench checks this before
    timing mlx-lm on the target's model object.
    """
    return [
        path or "<root>"
        for path, m in model.named_modules()
        if not type(m).__module__.startswith(("mlx.", "mlx_lm.")) and type(m).__module__ != "mlx"
    ]


# ---------------------------------------------------------------- attention


def rope_owners(model: nn.Module) -> list[nn.Module]:
    """The modules (attention layers) that hold a `rope` child module: where a positioned forward
    rotates tokens at their own positions (engine/positions.py)."""
    return [m for _, m in model.named_modules() if isinstance(m.get("rope"), nn.Module)]
