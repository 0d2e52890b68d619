"""Tiny random EAGLE-3 heads written in each published layout (tests only).

`random_weights(cfg)` makes seeded numpy weights with the names and shapes an EAGLE-3 head
has (norm weights away from 1, so a norm applied in the wrong place shows); `write(folder,
layout, ...)` saves them with the config.json that layout uses: "eagle" (SafeAILab/EAGLE,
yuhuili: LlamaForCausalLM + draft_vocab_size, `midlayer.*`), "angelslim"
(Eagle3LlamaForCausalLM), "specforge" (LlamaForCausalLMEagle3, eagle_config) and
"speculators" (Eagle3Speculator, transformer_layer_config, `layers.{i}.*`).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from specpipe.drafters.eagle3.head import Eagle3Head, HeadConfig

# sized to the tiny-random llama target (specpipe/engine/load/tiny.py: hidden 64, 4 heads of 16, 2 kv heads)
TINY = dict(
    hidden_size=64,
    target_hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=259,
    draft_vocab_size=100,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=4096,
)


def head_config(**overrides) -> HeadConfig:
    return HeadConfig(**{**TINY, **overrides})


def random_weights(cfg: HeadConfig, seed: int = 0, embedding: bool = True) -> dict[str, np.ndarray]:
    """Head parameters by name (Eagle3Head's names: layers.{i}.*), plus d2t / t2d for a reduced vocabulary."""
    rng = np.random.default_rng(seed)
    shapes = {k: v.shape for k, v in tree_flatten(Eagle3Head(cfg, embed=lambda ids: ids).parameters())}
    out = {}
    for name, shape in shapes.items():
        if name == "embed_tokens.weight" and not embedding:
            continue
        if "norm" in name:
            out[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            scale = 1.0 if name == "embed_tokens.weight" else 1.0 / np.sqrt(shape[-1])
            out[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    if cfg.draft_vocab_size != cfg.vocab_size:
        ids = np.sort(rng.choice(cfg.vocab_size, cfg.draft_vocab_size, replace=False))
        out["d2t"] = (ids - np.arange(cfg.draft_vocab_size)).astype(np.int64)
        t2d = np.zeros(cfg.vocab_size, dtype=bool)
        t2d[ids] = True
        out["t2d"] = t2d
    return out


def _llama_config(cfg: HeadConfig, arch: str, model_type: str = "llama") -> dict:
    return {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_layers,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": "float32",
    }


def config_json(cfg: HeadConfig, layout: str, taps: list[int] | None = None) -> dict:
    """The config.json each layout's exporter writes (only the keys its readers use, plus the usual ones)."""
    if layout == "speculators":
        layer = _llama_config(cfg, "LlamaForCausalLM", "qwen3" if cfg.qk_norm else "llama")
        del layer["architectures"]
        out = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.9.0",
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "verifier": {"name_or_path": "tiny-random-llama", "architectures": ["LlamaForCausalLM"]},
            },
            "transformer_layer_config": layer,
            "draft_vocab_size": cfg.draft_vocab_size,
            "norm_before_residual": cfg.norm_before_residual,
            "norm_before_fc": cfg.norm_before_fc,
            "fc_norm": cfg.fc_norm,
            "norm_output": cfg.norm_output,
            "target_hidden_size": cfg.target_hidden_size,
        }
        if taps is not None:
            out["eagle_aux_hidden_state_layer_ids"] = taps
        return out
    arch = {"eagle": "LlamaForCausalLM", "angelslim": "Eagle3LlamaForCausalLM", "specforge": "LlamaForCausalLMEagle3"}
    out = {**_llama_config(cfg, arch[layout]), "draft_vocab_size": cfg.draft_vocab_size}
    if cfg.target_hidden_size != cfg.hidden_size:
        out["target_hidden_size"] = cfg.target_hidden_size
    if layout == "eagle":
        del out["head_dim"]  # yuhuili's config.json has none (hidden_size / heads)
    if layout == "angelslim":
        out["target_model_type"] = "llama"
    if layout == "specforge" and taps is not None:
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": taps}
    return out


def checkpoint_names(weights: dict[str, np.ndarray], layout: str) -> dict[str, np.ndarray]:
    """Eagle3Head names -> the layout's tensor names (EAGLE-style exports call layer 0 `midlayer`)."""
    if layout == "speculators":
        return dict(weights)
    return {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: v for k, v in weights.items()}


def write(folder: Path, layout: str, cfg: HeadConfig, weights: dict[str, np.ndarray], taps=None) -> Path:
    """Save a head as `layout` would (model.safetensors; tests/test_eagle3_parity.py also writes .bin)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_json(cfg, layout, taps), indent=2))
    named = checkpoint_names(weights, layout)
    mx.save_safetensors(str(folder / "model.safetensors"), {k: mx.array(v) for k, v in named.items()})
    return folder
