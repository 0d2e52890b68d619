"""Write an EAGLE-3 head in the speculators layout (what vLLM and SGLang load, and layouts.py reads back).

Contract: `save_speculators(folder, head, taps, verifier, meta)` writes `config.json` (speculators'
`Eagle3SpeculatorConfig` keys: `speculators_model_type: eagle3`, `transformer_layer_config`,
`draft_vocab_size`, the norm flags, `eagle_aux_hidden_state_layer_ids` in vLLM's convention, the input
of layer i, as layer_taps.py taps) and `model.safetensors` (`layers.{i}.*`, `fc.weight`, `norm.weight`,
`lm_head.weight`, `d2t` offsets and the `t2d` mask; no `embed_tokens.weight`: the head reads the
target's, vLLM's rule when a checkpoint ships none), plus `specpipe_train.json` (how it was trained),
each through a temp file and a rename.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from specpipe.drafters.eagle3.head import Eagle3Head


def speculators_config(head: Eagle3Head, taps: tuple[int, ...], verifier: str) -> dict:
    cfg = head.cfg
    layer = {
        "model_type": "qwen3" if cfg.qk_norm else "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_layers,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "hidden_act": "silu",
        "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias,
        "tie_word_embeddings": False,
    }
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": verifier, "architectures": []},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(taps),
        "torch_dtype": "float32",
    }


def save_speculators(folder: Path, head: Eagle3Head, taps: tuple[int, ...], verifier: str, meta: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v for k, v in tree_flatten(head.parameters()) if k != "embed_tokens.weight"}
    cfg = head.cfg
    if head.d2t is not None:
        d2t = np.array(head.d2t).astype(np.int64)
        t2d = np.zeros(cfg.vocab_size, dtype=bool)
        t2d[np.arange(cfg.draft_vocab_size) + d2t] = True
        tensors["d2t"], tensors["t2d"] = mx.array(d2t), mx.array(t2d)
    tmp = folder / ".model.tmp.safetensors"
    mx.save_safetensors(str(tmp), tensors)
    os.replace(tmp, folder / "model.safetensors")
    for name, body in (
        ("config.json", speculators_config(head, taps, verifier)),
        ("specpipe_train.json", meta),
    ):
        part = folder / f".{name}.tmp"
        part.write_text(json.dumps(body, indent=2) + "\n")
        os.replace(part, folder / name)
