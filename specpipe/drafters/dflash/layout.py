"""Read a DFlash block drafter from a local folder, in the layout z-lab publishes (z-lab/*-DFlash-*).

Contract: `load_head(path)` returns (DFlashHead with its weights, HeadSource: the target layers the
head was trained on and its files). A folder in any other layout is a one-line SpecpipeError naming
what it found and what it expected. It reads config.json and safetensors only; nothing is downloaded
(a Hugging Face id is looked up in the local cache, as draft=eagle3 does).

The layout (z-lab/dflash `dflash/model_mlx.py::load_draft` and `dflash/model.py::DFlashDraftModel`):
config.json, a Qwen3-style config with `architectures: [DFlashDraftModel]`, `num_target_layers`,
`block_size`, and `dflash_config: {mask_token_id, target_layer_ids}`; tensors `fc.weight`,
`hidden_norm.weight`, `layers.{i}.{self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj,
input_layernorm, post_attention_layernorm}.weight`, `norm.weight`. No embedding and no LM head: the
target's are used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from specpipe.drafters.checkpoint_errors import one_line_errors
from specpipe.drafters.dflash.head import DFlashHead, HeadConfig
from specpipe.drafters.eagle3.layouts import resolve
from specpipe.drafters.json_file import read_json
from specpipe.drafters.safetensors_header import check_safetensors
from specpipe.errors import SpecpipeError

ARCHITECTURES = ("DFlashDraftModel",)
EXPECTED = (
    "a DFlash drafter folder: config.json with architectures [DFlashDraftModel] and "
    "dflash_config {mask_token_id, target_layer_ids}, and model.safetensors (or its index)"
)


@dataclass(frozen=True)
class HeadSource:
    """Where a head came from and which target layers it reads.

    target_layer_ids: as the checkpoint names them (the output of target layer i, as z-lab's
        `extract_context_feature` reads `hidden_states[i + 1]`); the drafter taps the input of layer i + 1.
    """

    path: Path
    files: tuple[str, ...]
    target_layer_ids: tuple[int, ...]
    num_target_layers: int


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's default when dflash_config names none: evenly from layer 1 to N - 3 (`build_target_layer_ids`)."""
    if num_draft_layers <= 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 3 - 1
    return tuple(int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers))


def _int(cfg: dict, key: str, where: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecpipeError(f"{where}: config key {key} is {value!r}, expected an integer ({EXPECTED})")
    return value


def read_config(folder: Path) -> tuple[HeadConfig, tuple[int, ...], int]:
    """(HeadConfig, target_layer_ids, num_target_layers) from config.json, or a one-line error."""
    where = str(folder / "config.json")
    if not (folder / "config.json").exists():
        found = sorted(p.name for p in folder.iterdir())[:8]
        raise SpecpipeError(f"{folder}: found {found or 'nothing'}, expected {EXPECTED}")
    cfg = read_json(folder / "config.json")
    arch = (cfg.get("architectures") or [None])[0]
    if arch not in ARCHITECTURES:
        raise SpecpipeError(
            f"{where}: architectures {cfg.get('architectures')!r}, expected {list(ARCHITECTURES)} "
            "(DFlash2DraftModel's convolutions and candidate selector are not read here)"
        )
    dflash = cfg.get("dflash_config")
    if not isinstance(dflash, dict) or not isinstance(dflash.get("mask_token_id"), int):
        raise SpecpipeError(f"{where}: dflash_config is {dflash!r}, expected {{mask_token_id, target_layer_ids}}")
    layer_types = set(cfg.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise SpecpipeError(
            f"{where}: layer_types {sorted(layer_types)}; only full_attention draft layers are read here"
        )
    if cfg.get("attention_bias") or cfg.get("hidden_act", "silu") != "silu":
        raise SpecpipeError(
            f"{where}: attention_bias / hidden_act {cfg.get('hidden_act')!r}: expected no bias and silu"
        )
    layers, heads, hidden = (_int(cfg, k, where) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size"))
    n_target = _int(cfg, "num_target_layers", where)
    taps = tuple(dflash.get("target_layer_ids") or build_target_layer_ids(n_target, layers))
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type"))
    return (
        HeadConfig(
            hidden_size=hidden,
            num_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            intermediate_size=_int(cfg, "intermediate_size", where),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            rope_scaling=None if kind in (None, "default") else rope,
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
            num_taps=len(taps),
            block_size=int(dflash.get("block_size", cfg.get("block_size", 16))),
            mask_token_id=dflash["mask_token_id"],
            is_causal=bool(cfg.get("is_causal") or False),
            input_embedding_scale=float(dflash.get("input_embedding_scale", 1.0)),
            output_multiplier=float(dflash.get("output_multiplier", 1.0)),
            final_logit_softcapping=dflash.get("final_logit_softcapping", cfg.get("final_logit_softcapping")),
        ),
        taps,
        n_target,
    )


def _weights(folder: Path) -> tuple[dict[str, mx.array], tuple[str, ...]]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = tuple(sorted(set(read_json(index)["weight_map"].values())))
    elif (folder / "model.safetensors").exists():
        shards = ("model.safetensors",)
    else:
        found = sorted(p.name for p in folder.iterdir())[:8]
        raise SpecpipeError(f"{folder}: found {found}, expected {EXPECTED}")
    tensors: dict[str, mx.array] = {}
    for shard in shards:
        check_safetensors(folder / shard)
        loaded = mx.load(str(folder / shard))
        assert isinstance(loaded, dict)  # safetensors always load as a dict
        tensors.update(loaded)
    return tensors, shards


@one_line_errors
def load_head(path: str | os.PathLike, dtype=mx.float32) -> tuple[DFlashHead, HeadSource]:
    """The head in `dtype` and where it came from; a one-line SpecpipeError for anything else."""
    folder = resolve(path)
    cfg, taps, n_target = read_config(folder)
    tensors, files = _weights(folder)
    head = DFlashHead(cfg)
    expected = {name for name, _ in tree_flatten(head.parameters())}
    missing, extra = sorted(expected - tensors.keys()), sorted(tensors.keys() - expected)
    if missing or extra:
        raise SpecpipeError(
            f"{folder}: tensors missing {missing[:3]} and unexpected {extra[:3]}: expected {EXPECTED} "
            "(fc, hidden_norm, layers.*, norm; no embedding or LM head of its own)"
        )
    shapes = dict(tree_flatten(head.parameters()))
    wrong = [
        f"{k} {tuple(v.shape)} (config.json says {tuple(shapes[k].shape)})"
        for k, v in tensors.items()
        if v.shape != shapes[k].shape
    ]
    if wrong:
        raise SpecpipeError(
            f"{folder}: tensors disagree with its config.json: {', '.join(wrong[:3])}; use the folder as published"
        )
    head.load_weights([(k, v.astype(dtype)) for k, v in tensors.items()])
    mx.eval(head.parameters())
    return head, HeadSource(folder, files, taps, n_target)
