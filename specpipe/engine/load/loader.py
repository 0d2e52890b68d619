"""Turn a model spec (packaged name, GGUF file, model folder, tiny random)
into an Engine, fully offline.

Contract: `load_engine(name=..., path=..., precision=...)` (or `load_target(cfg)` for a composed
config) returns an Engine or
raises SpecpipeError with one actionable line. No hub access, ever.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import cast

import mlx.core as mx
from mlx.utils import tree_flatten

from specpipe.engine.engine import Engine
from specpipe.engine.info import ModelInfo
from specpipe.engine.load.build import apply_precision, build_model, evaluate_buffers, weight_dtype
from specpipe.errors import ConfigError, SpecpipeError

TINY = "tiny-random"
# Packaged models whose architecture engine/load/gguf.py cannot build yet: refused before downloading them.
UNSUPPORTED_PACKAGED = {"gemma3-270m": "gemma3"}


def load_engine(
    name: str | None = None,
    path: str | None = None,
    precision: str = "stored",
    arch: str = "llama",
    seed: int = 0,
    tiny: dict | None = None,
    keys: tuple[str, str] = ("model", "model.path"),
) -> Engine:
    """Load one model.

    Args:
        name: a packaged model name (`specpipe-models list`) or "tiny-random".
        path: a GGUF file, an mlx-lm / Hugging Face model folder, or a
            Hugging Face repo id found in the local HF cache. Wins over `name`.
        precision: weight precision (see engine/load/build.py PRECISIONS).
        arch, seed, tiny: for "tiny-random": mlx-lm model_type, weight seed,
            config overrides.
        keys: the config keys the user typed `name` and `path` as, for the messages
            (a draft's are `("draft.model", "draft.path")`).
    """
    if path:
        engine = _load_path(str(path), keys[1], precision)
    elif name == TINY:
        engine = _load_tiny(arch, seed, tiny or {})
    elif name:
        engine = _load_packaged(name, keys, precision)
    else:
        raise SpecpipeError("no model given: set model=<packaged name> or model.path=<file.gguf|folder>")
    apply_precision(engine.model, precision)
    evaluate_buffers(engine.model)  # a forward on another thread (the server's worker) needs them evaluated
    engine.info = _with_precision(engine.info, engine.model)
    return engine


def load_target(cfg) -> Engine:
    """The target Engine a composed config asks for (its `model` group at `quant.precision`)."""
    from omegaconf import OmegaConf

    m = cfg.model
    tiny = cast(dict, OmegaConf.to_container(m.tiny)) if OmegaConf.is_config(m.tiny) else m.tiny
    return load_engine(m.name, m.path, cfg.quant.precision, m.arch, m.seed, tiny)


# ---------------------------------------------------------------- sources


def _load_packaged(name: str, keys: tuple[str, str] = ("model", "model.path"), precision: str = "stored") -> Engine:
    from specpipe.engine.load import model_store

    if name not in model_store.PACKAGED_MODELS:
        known = ", ".join(sorted(model_store.PACKAGED_MODELS) + [TINY])
        raise SpecpipeError(
            f"unknown {keys[0]} {name!r}: choose one of {known}, or set {keys[1]}=<file.gguf|folder|org/repo>"
        )
    if name in UNSUPPORTED_PACKAGED:
        from specpipe.engine.load.gguf import SUPPORTED_ARCHS

        usable = ", ".join(n for n in sorted(model_store.PACKAGED_MODELS) if n not in UNSUPPORTED_PACKAGED)
        raise ConfigError(
            f"model {name!r} has the {UNSUPPORTED_PACKAGED[name]} architecture, which the GGUF reader cannot build yet "
            f"(it reads {', '.join(SUPPORTED_ARCHS)}): choose one of {usable}, "
            f"or model=tiny-random model.arch={UNSUPPORTED_PACKAGED[name]}_text"
        )
    gguf_path = model_store.model_path(name)
    sha = model_store.PACKAGED_MODELS[name].sha256
    return _load_gguf(gguf_path, name=name, source="packaged", sha256=sha, precision=precision)


def _load_path(path: str, key: str = "model.path", precision: str = "stored") -> Engine:
    p = Path(path).expanduser()
    if not p.exists():
        from specpipe.engine.load.model_store import hf_hub_dir, resolve_hf_cache

        if looks_like_repo_id(path):
            found = resolve_hf_cache(path)
            if found is not None:
                return _load_folder(found, name=path)
            raise SpecpipeError(
                f"{key}={path} is not downloaded (no config.json for it in the Hugging Face cache {hf_hub_dir()}; "
                f"specpipe never downloads): on a machine that reaches the hub run `hf download {path}` "
                "(pip install huggingface_hub), copy that cache folder here (or point HF_HUB_CACHE at it), "
                "then run this again"
            )
        raise SpecpipeError(
            f"{key} {path!r} does not exist: give a .gguf file, a model folder, "
            f"or a repo id (org/name) in the local Hugging Face cache"
        )
    if p.is_dir():
        return _load_folder(p, name=p.name)
    return _load_gguf(p, name=p.stem, source="gguf", sha256=file_sha256(p), precision=precision)


def _load_gguf(path: Path, name: str, source: str, sha256: str, precision: str = "stored") -> Engine:
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper

    from specpipe.engine.load.gguf import read_gguf, read_header
    from specpipe.engine.load.load_progress import LoadProgress, gguf_bytes_needed, memory_notice, say

    # before any tensor is read: a load that cannot fit is said while there is still time to stop it
    tensors = read_header(path)[1]
    notice = memory_notice(name, gguf_bytes_needed(path, tensors, precision, on_gpu=mx.default_device() == mx.gpu))
    if notice:
        say(f"warning: {notice}")
    with LoadProgress(name, len(tensors)) as progress:
        ckpt = read_gguf(path, on_tensor=progress.step)
    model = build_model(ckpt.config, ckpt.weights, ckpt.quantization)
    tokenizer = TokenizerWrapper(ckpt.tokenizer, BPEStreamingDetokenizer, eos_token_ids=ckpt.eos_token_ids)
    info = ModelInfo(
        name=name, source=source, arch=ckpt.config["model_type"], precision="", path=str(path), sha256=sha256
    )
    return Engine(model, tokenizer, info)


def _load_folder(path: Path, name: str) -> Engine:
    from mlx_lm.utils import load_model, load_tokenizer

    if not (path / "config.json").exists():
        raise SpecpipeError(f"{path} has no config.json: give an mlx-lm / Hugging Face model folder or a .gguf file")
    try:
        model, config = load_model(path)
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except (FileNotFoundError, ValueError) as exc:
        raise SpecpipeError(f"cannot load model folder {path}: {_first_line(exc)}") from exc
    except (RuntimeError, OSError) as exc:  # e.g. "[load_safetensors] Invalid json header length"
        raise SpecpipeError(
            f"cannot load model folder {path}: a weight file is corrupt or incomplete ({_first_line(exc)})"
            f"; copy it again"
        ) from exc
    digest = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")):
        digest.update(file_sha256(f).encode())
    info = ModelInfo(
        name=name, source="folder", arch=config["model_type"], precision="", path=str(path), sha256=digest.hexdigest()
    )
    return Engine(model, tokenizer, info)


def _load_tiny(arch: str, seed: int, overrides: dict) -> Engine:
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper

    from specpipe.engine.load.tiny import build_tiny, byte_tokenizer

    model, config = build_tiny(arch, seed, overrides)
    tok = byte_tokenizer()
    tokenizer = TokenizerWrapper(tok, BPEStreamingDetokenizer, eos_token_ids=[tok.eos_token_id])
    spec = json.dumps({"arch": arch, "seed": seed, "config": config}, sort_keys=True)
    info = ModelInfo(
        name=f"{TINY}-{arch}", source=TINY, arch=arch, precision="", sha256=hashlib.sha256(spec.encode()).hexdigest()
    )
    return Engine(model, tokenizer, info)


# ---------------------------------------------------------------- helpers


def looks_like_repo_id(path: str) -> bool:
    """`org/name` as the hub spells it, not a file path (`./x`, `/x`, `~/x`, `a/b/c`, `x.gguf`)."""
    import re

    return (
        re.fullmatch(r"[\w.-]+/[\w.-]+", path) is not None
        and not path.startswith((".", "~"))
        and not path.endswith(".gguf")
    )


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _with_precision(info: ModelInfo, model) -> ModelInfo:
    params = tree_flatten(model.parameters())
    import msgspec

    return msgspec.structs.replace(
        info,
        precision=weight_dtype(model),
        parameters=sum(v.size for _, v in params if v.dtype != mx.uint32),
        weight_bytes=sum(v.nbytes for _, v in params),
    )


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """Content hash of a file, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
