"""Read an EAGLE-3 head from a local folder, in the layouts people publish.

Contract: `load_head(path, embed=...)` returns (Eagle3Head with its weights and d2t,
HeadSource: which layout, which taps the head was trained on, which files). A folder
in no known layout is a one-line SpecpipeError naming what it found and what it
expected. It reads files only (safetensors, or torch.save'd .bin through torch_bin.py,
never torch itself); nothing is downloaded: a Hugging Face id is looked up in the local
cache only. docs/drafters.md ("EAGLE-3 heads") lists every key read and its source.

Layouts (source files named in docs/drafters.md):
- "eagle": SafeAILab/EAGLE (yuhuili/EAGLE3-*), AngelSlim (`Eagle3LlamaForCausalLM`) and
  SpecForge (`LlamaForCausalLMEagle3`) exports: a flat llama config.json with
  `draft_vocab_size`, tensors `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`,
  `d2t`, `t2d`, optionally `embed_tokens.weight`.
- "speculators": vLLM speculators' `Eagle3Speculator` / `Eagle3DraftModel` (RedHatAI
  `*-speculator.eagle3`): config.json with `speculators_model_type: eagle3`,
  `transformer_layer_config`, `draft_vocab_size`, the norm flags and
  `eagle_aux_hidden_state_layer_ids`; tensors `layers.{i}.*` (else the same names).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from specpipe.drafters.checkpoint_errors import one_line_errors
from specpipe.drafters.eagle3.head import Eagle3Head, HeadConfig
from specpipe.drafters.eagle3.torch_bin import read_bin
from specpipe.drafters.json_file import read_json
from specpipe.drafters.safetensors_header import check_safetensors
from specpipe.errors import SpecpipeError

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
EAGLE_ARCHITECTURES = ("LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS_ARCHITECTURES = ("Eagle3Speculator", "Eagle3DraftModel")
LAYER_TYPES = ("llama", "qwen3")  # speculators' model_definitions.model_classes
EXPECTED = (
    "an EAGLE-3 head folder: config.json (EAGLE / AngelSlim / SpecForge: a llama config with draft_vocab_size; "
    "speculators: speculators_model_type eagle3) and model.safetensors or pytorch_model.bin"
)


@dataclass(frozen=True)
class HeadSource:
    """Where a head came from and what it expects of the target.

    taps: tap indices in the engine's convention (the input of layer i; layer_taps.py),
        or None: the head names none, use EAGLE's default (2, N//2, N-3) for the target.
    """

    layout: str  # "eagle" | "speculators"
    path: Path
    files: tuple[str, ...]
    taps: tuple[int, ...] | None
    verifier: str | None = None  # the target the checkpoint names, when it does


# ---------------------------------------------------------------- folders and files


def resolve(path: str | os.PathLike) -> Path:
    """A local folder, or a Hugging Face id found in the local cache (never downloaded)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    text = str(path)
    if p.exists():
        raise SpecpipeError(f"draft.path={text} is a file: pass the folder that holds config.json and the weights")
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(text, local_files_only=True))
        except Exception:  # any miss of the local cache is the same answer for the user
            pass
    raise SpecpipeError(
        f"draft.path={text}: no such folder (and no Hugging Face cache entry of that name): "
        "pass a local folder with the head's config.json and weights"
    )


def _weights(folder: Path) -> tuple[dict[str, mx.array], tuple[str, ...]]:
    present = [name for name in WEIGHT_FILES if (folder / name).exists()]
    if not present:
        found = sorted(p.name for p in folder.iterdir())[:8]
        raise SpecpipeError(f"{folder}: found {found or 'nothing'}, expected {EXPECTED}")
    first = present[0]
    if first.endswith(".index.json"):
        shards = sorted(set(read_json(folder / first)["weight_map"].values()))
    else:
        shards = [first]
    tensors: dict[str, mx.array] = {}
    for shard in shards:
        if shard.endswith(".safetensors"):
            check_safetensors(folder / shard)
            loaded = mx.load(str(folder / shard))
            assert isinstance(loaded, dict)  # safetensors always load as a dict
            tensors.update(loaded)
        else:
            tensors.update({k: mx.array(v) for k, v in read_bin(folder / shard).items()})
    return tensors, tuple(shards)


# ---------------------------------------------------------------- configs


def _int(cfg: dict, key: str, where: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int):
        raise SpecpipeError(f"{where}: config key {key} is {value!r}, expected an integer ({EXPECTED})")
    return value


def _head_config(layer: dict, where: str, **extra) -> HeadConfig:
    """HeadConfig from a llama-style config dict (EAGLE's flat config, or speculators' transformer_layer_config)."""
    if layer.get("hidden_act", "silu") != "silu":
        raise SpecpipeError(f"{where}: hidden_act {layer['hidden_act']!r}; the EAGLE-3 heads here use silu")
    hidden, heads = _int(layer, "hidden_size", where), _int(layer, "num_attention_heads", where)
    scaling = layer.get("rope_scaling") or layer.get("rope_parameters")
    rope_theta = layer.get("rope_theta")
    if isinstance(scaling, dict):
        rope_theta = rope_theta or scaling.get("rope_theta")
        kind = scaling.get("rope_type", scaling.get("type"))
        scaling = None if kind in (None, "default") else scaling
        if kind == "dynamic":
            raise SpecpipeError(f"{where}: rope_scaling type dynamic (NTK) is not supported; linear, llama3, yarn are")
    return HeadConfig(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=layer.get("num_key_value_heads") or heads,
        head_dim=layer.get("head_dim") or hidden // heads,
        intermediate_size=_int(layer, "intermediate_size", where),
        vocab_size=_int(layer, "vocab_size", where),
        num_layers=layer.get("num_hidden_layers") or 1,
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_theta or 10000.0),
        rope_scaling=scaling,
        max_position_embeddings=int(layer.get("max_position_embeddings") or 4096),
        attention_bias=bool(layer.get("attention_bias", False)),
        mlp_bias=bool(layer.get("mlp_bias", False)),
        **extra,
    )


def _speculators(cfg: dict, where: str) -> tuple[dict, tuple[int, ...] | None, str | None]:
    kind = cfg.get("speculators_model_type")
    if kind != "eagle3":
        raise SpecpipeError(f"{where}: speculators_model_type {kind!r}, expected eagle3 ({EXPECTED})")
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise SpecpipeError(f"{where}: no transformer_layer_config, which the speculators eagle3 format has")
    if layer.get("model_type", "llama") not in LAYER_TYPES:
        raise SpecpipeError(
            f"{where}: transformer_layer_config.model_type {layer.get('model_type')!r}, expected one of {LAYER_TYPES}"
        )
    if cfg.get("norm_before_fc") and cfg.get("fc_norm"):
        raise SpecpipeError(f"{where}: norm_before_fc and fc_norm are both set; speculators allows one")
    taps = cfg.get("eagle_aux_hidden_state_layer_ids")
    extra = dict(
        target_hidden_size=cfg.get("target_hidden_size") or layer["hidden_size"],
        draft_vocab_size=cfg.get("draft_vocab_size") or layer["vocab_size"],
        qk_norm=layer.get("model_type") == "qwen3",
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        fc_norm=bool(cfg.get("fc_norm", False)),
        norm_before_fc=bool(cfg.get("norm_before_fc", False)),
        norm_output=bool(cfg.get("norm_output", False)),
        num_taps=len(taps) if taps else 3,
    )
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    # speculators / vLLM: id i is the hidden state entering layer i (vLLM llama.py), the engine's convention
    return dict(layer=layer, extra=extra), (tuple(taps) if taps else None), verifier


def _eagle(cfg: dict, where: str) -> tuple[dict, tuple[int, ...] | None, str | None]:
    taps = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    extra = dict(
        target_hidden_size=cfg.get("target_hidden_size") or cfg["hidden_size"],
        draft_vocab_size=cfg.get("draft_vocab_size") or cfg["vocab_size"],
        fc_norm=bool(cfg.get("fc_norm", False)),
        # SpecForge's switch (default true): lm_head(norm(h)); false scores h itself
        logits_norm=bool(cfg.get("norm_output", True)),
        num_taps=len(taps) if taps else 3,
    )
    # SGLang / SpecForge name layer *outputs* (SGLang's llama.py adds 1); the engine taps inputs
    return dict(layer=cfg, extra=extra), (tuple(i + 1 for i in taps) if taps else None), None


def read_config(folder: Path) -> tuple[str, HeadConfig, tuple[int, ...] | None, str | None]:
    """(layout, HeadConfig without has_embedding, taps, verifier) from folder/config.json."""
    where = str(folder)
    path = folder / "config.json"
    if not path.exists():
        found = sorted(p.name for p in folder.iterdir())[:8]
        raise SpecpipeError(f"{where}: found {found or 'nothing'} but no config.json, expected {EXPECTED}")
    cfg = read_json(path)
    arch = (cfg.get("architectures") or [None])[0]
    if "speculators_model_type" in cfg or "speculators_config" in cfg or "transformer_layer_config" in cfg:
        layout, (parts, taps, verifier) = "speculators", _speculators(cfg, where)
    elif "draft_vocab_size" in cfg or arch in EAGLE_ARCHITECTURES[1:]:
        layout, (parts, taps, verifier) = "eagle", _eagle(cfg, where)
    else:
        raise SpecpipeError(
            f"{where}: config.json has architectures {arch!r} and no draft_vocab_size or speculators_model_type, "
            f"expected {EXPECTED}"
        )
    return layout, _head_config(parts["layer"], where, **parts["extra"]), taps, verifier


# ---------------------------------------------------------------- tensors


def _head_tensors(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    """Checkpoint names -> Eagle3Head parameter names (`midlayer.` is layer 0; a `model.` prefix is dropped)."""
    out = {}
    for key, value in tensors.items():
        name = key[len("model.") :] if key.startswith("model.") else key
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer.") :]
        out[name] = value
    return out


@one_line_errors
def load_head(path: str | os.PathLike, embed=None, dtype=mx.float32) -> tuple[Eagle3Head, HeadSource]:
    """Build an Eagle3Head from a folder (module docstring) with its weights and vocabulary map.

    Args:
        embed: the target's embedding, used when the checkpoint ships none (vLLM's rule).
        dtype: the floating dtype the weights are cast to (float32 on CPU: bf16 matmuls are slow there).

    Raises:
        SpecpipeError (one line) for a folder in no known layout, a missing or misshapen tensor.
    """
    folder = resolve(path)
    layout, cfg, taps, verifier = read_config(folder)
    raw, files = _weights(folder)
    tensors = _head_tensors(raw)
    d2t, t2d = tensors.pop("d2t", None), tensors.pop("t2d", None)
    for unused in ("verifier_lm_head.weight", "verifier_norm.weight"):  # speculators' training-only copies
        tensors.pop(unused, None)
    has_embedding = "embed_tokens.weight" in tensors
    if not has_embedding and embed is None:
        raise SpecpipeError(f"{folder}: the head ships no embed_tokens.weight; load it with the target's embedding")
    cfg = dataclasses.replace(cfg, has_embedding=has_embedding)
    head = Eagle3Head(cfg, embed=embed)
    expected = dict(_flat(head.parameters()))
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise SpecpipeError(
            f"{folder} ({layout} layout): "
            + (f"missing tensors {missing[:4]}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (f"tensors this head does not have {unexpected[:4]}" if unexpected else "")
            + f"; expected {sorted(expected)[:6]}..."
        )
    wrong = [
        f"{k} {tuple(v.shape)} (expected {tuple(expected[k].shape)})"
        for k, v in tensors.items()
        if v.shape != expected[k].shape
    ]
    if wrong:
        raise SpecpipeError(f"{folder} ({layout} layout): misshapen tensors: {', '.join(wrong[:3])}")
    head.load_weights([(k, v.astype(dtype)) for k, v in tensors.items()])
    head.set_vocab_map(_vocab_map(d2t, t2d, cfg, folder))
    mx.eval(head.parameters())
    return head, HeadSource(layout=layout, path=folder, files=files, taps=taps, verifier=verifier)


def _vocab_map(d2t, t2d, cfg: HeadConfig, folder: Path) -> mx.array | None:
    """The d2t offsets, checked against t2d (the same set of target ids) when both are there."""
    if cfg.draft_vocab_size == cfg.vocab_size and (d2t is None or not np.asarray(d2t).any()):
        return None  # one vocabulary: identity (speculators ignores identity maps too)
    if d2t is None:
        raise SpecpipeError(
            f"{folder}: a draft vocabulary of {cfg.draft_vocab_size} ids (target {cfg.vocab_size}) but no d2t tensor"
        )
    offsets = np.asarray(d2t).astype(np.int64)
    if offsets.shape != (cfg.draft_vocab_size,):
        raise SpecpipeError(f"{folder}: d2t has shape {offsets.shape}, expected ({cfg.draft_vocab_size},)")
    ids = np.arange(cfg.draft_vocab_size) + offsets
    if ids.min() < 0 or ids.max() >= cfg.vocab_size or len(np.unique(ids)) != len(ids):
        raise SpecpipeError(f"{folder}: d2t maps draft ids outside 0..{cfg.vocab_size - 1} or onto one id twice")
    if t2d is not None:
        mask = np.asarray(t2d).astype(bool)
        if mask.shape != (cfg.vocab_size,) or not mask[ids].all() or mask.sum() != len(ids):
            raise SpecpipeError(f"{folder}: t2d and d2t name different target ids")
    return mx.array(offsets.astype(np.int32))


def _flat(params, prefix: str = "") -> list[tuple[str, mx.array]]:
    from mlx.utils import tree_flatten

    return tree_flatten(params, prefix=prefix)
