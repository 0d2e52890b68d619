"""Tiny random DFlash drafters in z-lab's published layout (config.json + model.safetensors), for tests.

`write_drafter(folder, target_layers=..., ...)` writes a folder that specpipe's draft=dflash and z-lab's
`dflash.model_mlx.load_draft` both read: a Qwen3-style config with `architectures: [DFlashDraftModel]`,
`num_target_layers`, `block_size` and `dflash_config {mask_token_id, target_layer_ids}`, and the tensors
fc, hidden_norm, layers.{i}.*, norm (no embedding, no LM head).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

HIDDEN = 64  # the tiny-random targets' width (specpipe/engine/load/tiny.py)


def config(
    num_target_layers: int,
    target_layer_ids=(1, 3),
    block_size: int = 6,
    mask_token_id: int = 99,
    num_hidden_layers: int = 2,
    **overrides,
) -> dict:
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 96,
        "vocab_size": 100,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "num_target_layers": num_target_layers,
        "block_size": block_size,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)},
    }
    cfg.update(overrides)
    return cfg


def random_weights(cfg: dict, seed: int = 0, scale: float = 0.08) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, hd, inter = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    taps = len(cfg["dflash_config"]["target_layer_ids"])

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"fc.weight": mat(h, taps * h), "hidden_norm.weight": norm(h), "norm.weight": norm(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w |= {
            p + "self_attn.q_proj.weight": mat(q, h),
            p + "self_attn.k_proj.weight": mat(kv, h),
            p + "self_attn.v_proj.weight": mat(kv, h),
            p + "self_attn.o_proj.weight": mat(h, q),
            p + "self_attn.q_norm.weight": norm(hd),
            p + "self_attn.k_norm.weight": norm(hd),
            p + "mlp.gate_proj.weight": mat(inter, h),
            p + "mlp.up_proj.weight": mat(inter, h),
            p + "mlp.down_proj.weight": mat(h, inter),
            p + "input_layernorm.weight": norm(h),
            p + "post_attention_layernorm.weight": norm(h),
        }
    return w


def write(folder: Path, cfg: dict, weights: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    mx.save_safetensors(str(folder / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()})
    return folder


def write_drafter(folder: Path, num_target_layers: int, seed: int = 0, scale: float = 0.08, **overrides) -> Path:
    cfg = config(num_target_layers, **overrides)
    return write(folder, cfg, random_weights(cfg, seed=seed, scale=scale))
