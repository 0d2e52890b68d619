"""Build an mlx-lm model object from a config dict and a flat weight dict.

Every loader (GGUF file, model folder, tiny random) ends here, so the model
classes are always mlx-lm's own. Weight precision is changed afterwards by
`apply_precision`; this module never reads files.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map

from specpipe.errors import ConfigError, SpecpipeError

PRECISIONS = ("auto", "stored", "float32", "bfloat16", "float16", "mlx4", "mlx8")


def model_classes(config: dict):
    """Return mlx-lm's (Model, ModelArgs) for `config["model_type"]`."""
    from mlx_lm.utils import _get_classes

    try:
        return _get_classes(config)
    except (ValueError, AttributeError) as exc:  # no such module, or a module without Model (cache, base)
        raise ConfigError(
            f"model_type {config.get('model_type')!r} is not an mlx-lm architecture: choose one of "
            f"{', '.join(architectures())} (model.arch= for tiny-random)"
        ) from exc


def architectures() -> list[str]:
    """mlx-lm's model types: the modules of mlx_lm.models that define Model and ModelArgs (read as text)."""
    from pathlib import Path

    import mlx_lm.models

    names = []
    for folder in map(Path, mlx_lm.models.__path__):
        for path in folder.glob("*.py"):
            text = path.read_text(encoding="utf-8", errors="replace")
            if "class Model(" in text and "class ModelArgs" in text:
                names.append(path.stem)
    return sorted(names)


def build_model(
    config: dict,
    weights: dict[str, mx.array],
    quantization: dict[str, dict] | None = None,
    strict: bool = True,
) -> nn.Module:
    """Instantiate an mlx-lm model and load `weights` into it.

    Args:
        config: mlx-lm style config (must hold `model_type`).
        weights: parameter name -> array, in mlx-lm naming (pre-`sanitize`
            names are fine: the model's own `sanitize` is applied).
        quantization: module path -> {"group_size", "bits"} for layers whose
            weights arrive already quantized (uint32 `weight` + `scales` +
            `biases`), e.g. GGUF Q4_0/Q4_1/Q8_0 read by `mx.load`.
        strict: refuse missing or unexpected parameters.

    Returns:
        The model in eval mode, with parameters evaluated.
    """
    model_cls, args_cls = model_classes(config)
    model = model_cls(args_cls.from_dict(config))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(dict(weights))
    if quantization:
        nn.quantize(
            model,
            class_predicate=lambda path, module: dict(quantization[path]) if path in quantization else False,
        )
    model.eval()
    try:
        model.load_weights(list(weights.items()), strict=strict)
    except ValueError as exc:
        raise SpecpipeError(f"weights do not fit the {config.get('model_type')} architecture: {exc}") from exc
    mx.eval(model.parameters())
    return model


def apply_precision(model: nn.Module, precision: str) -> nn.Module:
    """Convert weights in place to `precision` (one of PRECISIONS).

    "stored" keeps what the loader produced; float types dequantize any
    quantized layers first; "mlx4"/"mlx8" requantize with MLX's affine
    scheme (group size 64), whatever the source format was.
    """
    if precision not in PRECISIONS:
        raise SpecpipeError(f"quant={precision!r} is unknown: choose one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        precision = auto_precision(model)
    if precision == "stored":
        return model
    from mlx_lm.utils import dequantize_model

    if precision == "float32":
        # GGUF scales are float16: upcast them first, or the dequantized
        # weights are rounded to float16 (logits move by up to ~0.07).
        _cast_floats(model, mx.float32)
    dequantize_model(model)
    if precision in ("mlx4", "mlx8"):
        _cast_floats(model, mx.float16 if _has_half(model) else mx.float32)
        bits = 4 if precision == "mlx4" else 8
        nn.quantize(
            model,
            group_size=64,
            bits=bits,
            class_predicate=lambda _, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % 64 == 0,
        )
    else:
        _cast_floats(model, getattr(mx, precision))
    mx.eval(model.parameters())
    return model


def evaluate_buffers(model: nn.Module) -> None:
    """Evaluate every array the model's modules hold outside their parameters (an `_`-named attribute, e.g.
    mlx-lm's gemma4 ProportionalRoPE `_freqs`). Left lazy, such an array belongs to the loading thread's
    stream, and the first forward on another thread (the server's worker) fails with "There is no Stream(cpu,
    0) in current thread"; parameters are evaluated where they are loaded."""
    mx.eval([v for _, m in model.named_modules() for v in m.values() if isinstance(v, mx.array)])


def auto_precision(model: nn.Module) -> str:
    """The fastest precision for this device that fits in memory.

    GPUs (Metal, CUDA) have fast quantized kernels: keep what is stored.
    On CPU, MLX's quantized and half-precision matmuls do not use BLAS and cost
    K times for K tokens, while float32 goes through (an optimised) BLAS where
    verifying K tokens costs little more than one: float32, if it fits in
    40% of RAM; otherwise keep what is stored.
    """
    if mx.default_device() == mx.gpu:
        return "stored"
    n_params = 0
    for _, m in model.named_modules():
        if hasattr(m, "bits") and hasattr(m, "scales"):
            n_params += m.weight.size * 32 // m.bits
    n_params += sum(v.size for _, v in tree_flatten(model.parameters()) if v.dtype != mx.uint32) - sum(
        m.scales.size * 2 for _, m in model.named_modules() if hasattr(m, "bits") and hasattr(m, "scales")
    )
    from specpipe.engine.load.load_progress import AUTO_FLOAT32_RAM_SHARE, total_ram  # one rule, priced before loads

    return "float32" if n_params * 4 < AUTO_FLOAT32_RAM_SHARE * total_ram() else "stored"


def _has_half(model: nn.Module) -> bool:
    return any(v.dtype in (mx.float16, mx.bfloat16) for _, v in tree_flatten(model.parameters()))


def _cast_floats(model: nn.Module, dtype: mx.Dtype) -> None:
    """Cast every floating-point parameter (not packed uint32 weights)."""
    params = tree_map(
        lambda v: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v,
        model.parameters(),
    )
    model.update(params)


def weight_dtype(model: nn.Module) -> str:
    """Describe the model's weight precision, e.g. 'float32' or 'q4/q8'."""
    bits = sorted({m.bits for _, m in model.named_modules() if hasattr(m, "bits")})
    if bits:
        return "/".join(f"q{b}" for b in bits)
    dtypes = {v.dtype for _, v in tree_flatten(model.parameters())}
    return ",".join(sorted(str(d).replace("mlx.core.", "") for d in dtypes))
