"""Tiny random Gemma-4 assistants written in the published layout (tests only).

`write(folder, ...)` saves config.json (model_type gemma4_assistant, backbone_hidden_size, text_config)
and model.safetensors with the tensor names mlx-vlm 0.7.10's Gemma4AssistantDraftModel loads, sized to
the tiny-random gemma4_text target (specpipe/engine/load/tiny.py: hidden 64, 2 kv heads of 16 on sliding
layers, 32 on full ones, window 64). Norm weights are drawn away from 1, so a norm in the wrong place shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

TARGET_TINY = {"num_hidden_layers": 4}  # tiny.py's gemma4_text: 2 layers with K/V, 2 reading theirs


def text_config(vocab: int = 259, **over) -> dict:
    return dict(
        model_type="gemma4_text",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        rms_norm_eps=1e-5,
        vocab_size=vocab,
        vocab_size_per_layer_input=vocab,
        hidden_size_per_layer_input=0,
        sliding_window=64,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=4096,
        # the target's (mlx-lm's gemma4_text defaults); written out as published configs do, since mlx-vlm's
        # TextConfig defaults differ (full attention: partial_rotary_factor 1.0)
        rope_parameters={
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
        },
        **over,
    )


def config(vocab: int = 259, centroids: int | None = None, tied: bool = True) -> dict:
    cfg = dict(model_type="gemma4_assistant", backbone_hidden_size=64, tie_word_embeddings=tied,
               text_config=text_config(vocab))  # fmt: skip
    if centroids:
        cfg.update(use_ordered_embeddings=True, num_centroids=centroids, centroid_intermediate_top_k=2)
    return cfg


def random_weights(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Every tensor the assistant of `cfg` has, by its published name, seeded."""
    from mlx.utils import tree_flatten

    from specpipe.drafters.gemma4_assistant.layout import _config
    from specpipe.drafters.gemma4_assistant.model import Gemma4Assistant

    model = Gemma4Assistant(_config(Path("."), cfg))
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in tree_flatten(model.parameters()):
        shape = value.shape
        if name.endswith("token_ordering"):
            out[name] = rng.permutation(shape[0]).astype(np.int64)  # int64, as published
        elif "norm" in name or name.endswith("layer_scalar"):
            out[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            scale = 1.0 if "embed_tokens" in name else 1.0 / np.sqrt(shape[-1])
            out[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return out


def aim_at(weights: dict[str, np.ndarray], tokens: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    """The tied LM head scores only `tokens` (rows ±v1, ±v2, ...; every other row 0): whatever the hidden
    state, one of them wins (|h·v| > 0), so drafting a target's frequent tokens some drafts hit, some miss."""
    rng = np.random.default_rng(seed)
    rows = np.zeros_like(weights["model.embed_tokens.weight"])
    for i in range(0, len(tokens), 2):
        v = rng.standard_normal(rows.shape[1]).astype(np.float32)
        rows[tokens[i]] = v
        if i + 1 < len(tokens):
            rows[tokens[i + 1]] = -v
    return {**weights, "model.embed_tokens.weight": rows}


def write(folder: Path, cfg: dict, weights: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    mx.save_safetensors(str(folder / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()})
    return folder
