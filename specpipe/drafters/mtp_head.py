"""The MTP head module and where its weights come from.

Contract: `MtpHead(hidden, embedded, cache)` maps the target's final hidden
state h[i] and the embedding of token i+1 to a hidden state whose LM-head
logits predict token i+2 (Qwen3-Next / Qwen3.5 `mtp.*`, DeepSeek-V3 / GLM
"nextn" and specpipe-trained heads all share this shape):

    x = fc([norm_e(embed(t[i+1])); norm_h(h[i])])   # 2H -> H
    x = block(x)                                    # one full-attention layer of the target's kind
    return norm(x)                                  # fed to the target's own LM head

`load_head(target, path)` finds and loads weights; it never trains or downloads.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.base import create_attention_mask

from specpipe.drafters.json_file import read_json
from specpipe.drafters.safetensors_header import check_safetensors
from specpipe.engine import introspect
from specpipe.errors import SpecpipeError

HEAD_FILE, HEAD_JSON, FORMAT = "mtp_head.safetensors", "mtp_head.json", "specpipe-mtp-head/1"
NO_HEAD_HINT = (
    "train one with `specpipe-train-drafter model=<same model>`, pass draft.head=<folder>, "
    "or use a drafter without a head: draft=layerskip, draft=ngram or draft=model"
)
ZERO_CENTERED_NORMS = {"qwen3_next", "qwen3_5", "qwen3_5_moe"}  # HF files store w - 1 for these norms


class MtpHead(nn.Module):
    def __init__(self, block: nn.Module, hidden_size: int, eps: float):
        super().__init__()
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden_size, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden_size, eps=eps)
        self.fc = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.layers = [block]
        self.norm = nn.RMSNorm(hidden_size, eps=eps)

    def __call__(self, hidden: mx.array, embedded: mx.array, cache=None) -> mx.array:
        """hidden, embedded: [b, n, H] -> [b, n, H] (normed; apply the target's LM head for logits)."""
        x = mx.concatenate([self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], axis=-1)
        x = self.fc(x)
        x = self.layers[0](x, create_attention_mask(x, cache), cache)
        return self.norm(x)


def new_head(inner: nn.Module) -> tuple[MtpHead, int]:
    """A head whose block is a copy of the target's last full-attention layer.

    Returns:
        (head, index of the copied layer); the block starts with that layer's weights.
    """
    found = introspect.last_full_attention(inner)
    if found is None:
        raise SpecpipeError("draft=mtp: the target has no full-attention layer to shape an MTP block after")
    i, layer = found
    norm = introspect.final_norm(inner)
    hidden_size = norm.weight.shape[0]
    head = MtpHead(copy.deepcopy(layer), hidden_size, getattr(norm, "eps", 1e-6))
    dtype = norm.weight.dtype
    head.update(tree_map(lambda v: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v, head.parameters()))
    return head, i


# ---------------------------------------------------------------- loading


def load_head(target, inner: nn.Module, path: str | None) -> tuple[MtpHead, str]:
    """Load the MTP head for `target`.

    Args:
        target: the target Engine (its info says where the model lives).
        inner: the target's inner model (embed_tokens, layers, norm).
        path: draft.head: a specpipe head folder / .safetensors file, or a
            checkpoint folder with `mtp.*` / nextn tensors; None looks in the
            target's own folder, then at `default_head_dir(target.info)`.

    Returns:
        (head, a short description of where it came from)
    """
    candidates = (
        [Path(path).expanduser()]
        if path
        else [p for p in (_model_dir(target.info), default_head_dir(target.info)) if p]
    )
    for where in candidates:
        if path and not where.exists():
            raise SpecpipeError(
                f"draft.head={path!r} does not exist: give a folder made by specpipe-train-drafter "
                f"or a checkpoint folder with mtp.* tensors"
            )
        weights, source = _find_weights(where)
        if weights is not None:
            head, _ = new_head(inner)
            _check_trained_for(target.info, where, source)
            try:
                head.load_weights(list(weights.items()), strict=True)
            except ValueError as exc:
                raise SpecpipeError(
                    f"MTP head in {where} does not fit {target.info.name}: {str(exc).splitlines()[0]}"
                ) from exc
            head.eval()
            mx.eval(head.parameters())
            return head, f"{source} ({where})"
    looked = " or ".join(str(c) for c in candidates) or "nowhere (no model path)"
    raise SpecpipeError(
        f"{target.info.name} ships no MTP head (no mtp.* or nextn tensors, no {HEAD_FILE} in {looked}): {NO_HEAD_HINT}"
    )


def default_head_dir(info) -> Path:
    """Where specpipe-train-drafter saves a head by default: next to the model file."""
    if info.path and Path(info.path).is_file():
        p = Path(info.path)
        return p.with_name(p.name.split(".gguf")[0] + ".mtp-head")
    return Path.home() / ".cache" / "specpipe" / "heads" / info.name


def _model_dir(info) -> Path | None:
    return Path(info.path) if info.path and Path(info.path).is_dir() else None


def _find_weights(where: Path) -> tuple[dict | None, str]:
    """{name in MtpHead: array} from a specpipe head or a checkpoint, or (None, "")."""
    if where.is_file() and where.suffix == ".safetensors":
        check_safetensors(where)
        return dict(mx.load(str(where))), "trained head"
    if not where.is_dir():
        return None, ""
    if (where / HEAD_FILE).exists():
        check_safetensors(where / HEAD_FILE)
        return dict(mx.load(str(where / HEAD_FILE))), "trained head"
    config = read_json(where / "config.json") if (where / "config.json").exists() else {}
    text = config.get("text_config", config)
    nextn = f"model.layers.{text.get('num_hidden_layers', -1)}."
    found: dict[str, mx.array] = {}
    hf_layout = False
    for f in sorted(where.glob("*.safetensors")):
        check_safetensors(f)
        for k, v in mx.load(str(f)).items():
            hf_layout = hf_layout or ("conv1d.weight" in k and v.shape[-1] != 1)  # unconverted HF checkpoint
            if "mtp." in k:
                found[k.split("mtp.", 1)[1]] = v
            elif k.startswith(nextn) and text.get("num_nextn_predict_layers"):
                found.update(_nextn_name(k[len(nextn) :], v))
    if not found:
        return None, ""
    if hf_layout and {config.get("model_type"), text.get("model_type")} & ZERO_CENTERED_NORMS:
        # the rule mlx-lm's qwen3_5 sanitize applies to the main model's norms
        found = {k: v + 1.0 if k.endswith("norm.weight") and v.ndim == 1 else v for k, v in found.items()}
    return _stack_experts(found), "checkpoint MTP head"


def _nextn_name(rest: str, value: mx.array) -> dict:
    """DeepSeek-V3 / GLM nextn layer names -> MtpHead names (embedding and head are the target's)."""
    renames = {
        "enorm.": "pre_fc_norm_embedding.",
        "hnorm.": "pre_fc_norm_hidden.",
        "eh_proj.": "fc.",
        "shared_head.norm.": "norm.",
    }
    for old, new in renames.items():
        if rest.startswith(old):
            return {new + rest[len(old) :]: value}
    if rest.startswith(("embed_tokens.", "shared_head.head.")):
        return {}
    return {"layers.0." + rest: value}


def _stack_experts(weights: dict) -> dict:
    """Per-expert MoE tensors -> mlx-lm's stacked switch_mlp layout (as the models' sanitize does)."""
    prefix = "layers.0.mlp.experts."
    ids = sorted({int(k[len(prefix) :].split(".")[0]) for k in weights if k.startswith(prefix)})
    for n in ("up_proj", "down_proj", "gate_proj"):
        if ids and f"{prefix}0.{n}.weight" in weights:
            weights[f"layers.0.mlp.switch_mlp.{n}.weight"] = mx.stack(
                [weights.pop(f"{prefix}{e}.{n}.weight") for e in ids]
            )
    return weights


def _check_trained_for(info, where: Path, source: str) -> None:
    meta_path = where.with_suffix(".json") if where.is_file() else where / HEAD_JSON
    if source != "trained head" or not meta_path.exists():
        return
    meta = json.loads(meta_path.read_text())
    trained = meta.get("target", {})
    if trained.get("sha256") and info.sha256 and trained["sha256"] != info.sha256:
        raise SpecpipeError(
            f"the MTP head in {where} was trained for {trained.get('name')}, not {info.name}: {NO_HEAD_HINT}"
        )


def save_head(head: MtpHead, folder: Path, meta: dict) -> None:
    """Write `mtp_head.safetensors` + `mtp_head.json` (what load_head reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / HEAD_FILE), dict(tree_flatten(head.parameters())))
    (folder / HEAD_JSON).write_text(json.dumps({"format": FORMAT, **meta}, indent=2) + "\n")
