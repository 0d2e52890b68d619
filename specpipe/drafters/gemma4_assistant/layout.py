"""Read a Gemma-4 assistant checkpoint folder: config.json + *.safetensors, as Google publishes them.

Contract: `load_assistant(path)` returns (Gemma4Assistant with its weights, AssistantSource) or raises a
one-line SpecpipeError naming what it found and what it expected (no config, another model_type, a
missing / unexpected / misshapen tensor). Tensor names are the module paths of mlx-vlm 0.7.10's
Gemma4AssistantDraftModel, which loads the published (Hugging Face) checkpoints as they are, save for
`lm_head.weight` when tied (dropped) and `masked_embedding.token_ordering` (int64, read as int32).
Nothing read from the folder runs code: JSON and safetensors only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.gemma4_text import ModelArgs

from specpipe.drafters.checkpoint_errors import one_line_errors
from specpipe.drafters.gemma4_assistant.model import AssistantConfig, Gemma4Assistant
from specpipe.drafters.json_file import read_json
from specpipe.drafters.safetensors_header import check_safetensors
from specpipe.engine.load.build import evaluate_buffers
from specpipe.errors import SpecpipeError

MODEL_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")  # the unified one reuses the same drafter (mlx-vlm)


@dataclass(frozen=True)
class AssistantSource:
    path: str
    model_type: str
    tensors: int


@one_line_errors
def load_assistant(path: str) -> tuple[Gemma4Assistant, AssistantSource]:
    folder = _folder(path)
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise SpecpipeError(
            f"{folder}: no config.json; expected a Gemma-4 assistant folder (config.json + *.safetensors)"
        )
    raw = read_json(cfg_file)
    model_type = raw.get("model_type")
    if model_type not in MODEL_TYPES:
        raise SpecpipeError(
            f"{folder}: config.json says model_type={model_type!r}; expected {' or '.join(MODEL_TYPES)} "
            "(a google/gemma-4-*-assistant checkpoint)"
        )
    cfg = _config(folder, raw)
    model = Gemma4Assistant(cfg)
    weights = _weights(folder, cfg)
    _check_names(folder, model, weights)
    model.load_weights(list(weights.items()), strict=False)  # names and shapes checked above
    model.eval()
    mx.eval(model.parameters())
    evaluate_buffers(model)  # its layers' RoPE frequencies: a server's worker thread drafts with them
    return model, AssistantSource(str(folder), model_type, len(weights))


def _folder(path: str) -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise SpecpipeError(f"draft.path={path}: not a folder; give the Gemma-4 assistant's checkpoint folder")
    return folder


def _config(folder: Path, raw: dict) -> AssistantConfig:
    text = raw.get("text_config")
    if not isinstance(text, dict) or "backbone_hidden_size" not in raw:
        raise SpecpipeError(
            f"{folder}: config.json has no text_config / backbone_hidden_size; expected the gemma4_assistant layout"
        )
    n = int(text.get("num_hidden_layers", 0))
    shared = int(text.get("num_kv_shared_layers") or n)
    if shared < n:  # HF: unset or 0 means every layer reads the target's K/V; fewer would need K/V of its own
        raise SpecpipeError(
            f"{folder}: text_config.num_kv_shared_layers={shared} < num_hidden_layers={n}; "
            "a Gemma-4 assistant reads the target's K/V in every layer"
        )
    args = ModelArgs.from_dict({**text, "model_type": "gemma4_text", "num_kv_shared_layers": n})
    keys = ("use_ordered_embeddings", "num_centroids", "centroid_intermediate_top_k", "tie_word_embeddings")
    if raw.get("use_ordered_embeddings"):  # the centroid head splits the vocabulary into equal clusters
        clusters, top_k = int(raw.get("num_centroids", 2048)), int(raw.get("centroid_intermediate_top_k", 32))
        if args.vocab_size % clusters or not 1 <= top_k <= clusters:
            raise SpecpipeError(
                f"{folder}: num_centroids={clusters}, centroid_intermediate_top_k={top_k}: allowed a num_centroids "
                f"dividing text_config.vocab_size={args.vocab_size} and a top_k of 1..num_centroids"
            )
    return AssistantConfig(
        text=args, backbone_hidden_size=int(raw["backbone_hidden_size"]), **{k: raw[k] for k in keys if k in raw}
    )


def _weights(folder: Path, cfg: AssistantConfig) -> dict[str, mx.array]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SpecpipeError(f"{folder}: no *.safetensors file; expected the assistant's weights beside config.json")
    weights: dict[str, mx.array] = {}
    for f in files:
        check_safetensors(f)
        weights.update(mx.load(str(f)))  # type: ignore[arg-type]  # safetensors: a dict of arrays
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)  # some exports write the tied copy too
    if "masked_embedding.token_ordering" in weights:
        order = weights["masked_embedding.token_ordering"]
        vocab = cfg.text.vocab_size
        # ids for a gather and a scatter over the vocabulary: one outside it read and wrote outside the buffer
        if order.size and (int(order.min().item()) < 0 or int(order.max().item()) >= vocab):
            raise SpecpipeError(
                f"{folder}: masked_embedding.token_ordering holds ids {int(order.min().item())}.."
                f"{int(order.max().item())}: allowed 0..{vocab - 1} (text_config.vocab_size={vocab})"
            )
        weights["masked_embedding.token_ordering"] = order.astype(mx.int32)
    for k in [k for k in weights if "self_attn.rotary_emb" in k]:
        del weights[k]  # a buffer some exports keep; RoPE is recomputed
    return weights


def _check_names(folder: Path, model: Gemma4Assistant, weights: dict[str, mx.array]) -> None:
    want = {k: v.shape for k, v in tree_flatten(model.parameters())}
    # (the frozen token_ordering buffer is among parameters(): frozen is not trainable, still a parameter)
    missing = sorted(set(want) - set(weights))
    extra = sorted(set(weights) - set(want))
    if missing or extra:
        found = f"missing {', '.join(missing[:3])}" if missing else f"unexpected {', '.join(extra[:3])}"
        centroids = ", masked_embedding.*" if "masked_embedding" in model else ""
        raise SpecpipeError(
            f"{folder}: {found}{' ...' if len(missing or extra) > 3 else ''}; expected the gemma4_assistant "
            f"tensors (model.layers.*, pre_projection, post_projection{centroids})"
        )
    for k, shape in want.items():
        if tuple(weights[k].shape) != tuple(shape):
            raise SpecpipeError(f"{folder}: {k} has shape {tuple(weights[k].shape)}, the config gives {tuple(shape)}")
