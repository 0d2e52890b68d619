"""Read a GGUF file into a `Checkpoint` that `build.build_model` can build.

Contract: `read_gguf(path)` works offline and returns mlx-lm's config dict
and parameter names for the `llama` and `qwen2` architectures, the
tokenizer rebuilt from the file's metadata (see `gguf_tokenizer`), the
end-of-generation ids, and a few metadata scalars. Anything wrong with the
file that the user can fix raises `SpecpipeError` with one line.

Tensors take one of two routes:

* `mx.load` reads F32/F16 and Q4_0/Q4_1/Q8_0 natively; the quantized ones
  stay MLX affine triplets (`weight` uint32, `scales`, `biases`; group 32)
  and are listed in `Checkpoint.quantization`.
* A file holding any other type (K-quants, Q5_0, BF16...) has every tensor
  dequantized to float32 with the `gguf` package (about 4 bytes a
  parameter: ~2 GB for a 0.5B model). mx.load is not trusted with those:
  it loads some K-quant files but decodes Q4_K wrongly (mlx 0.32).

llama.cpp's converter permutes the Q/K rows of `llama` checkpoints for
GGML's adjacent-pair RoPE; we undo that so mlx-lm's rotate-half RoPE is
right. `qwen2` uses NEOX RoPE (rotate-half already) and is stored as is.

The header is parsed here rather than with `gguf.GGUFReader`, which builds a
numpy view per vocabulary string and takes ~4 s (SmolLM2) to ~15 s (Qwen).
"""

from __future__ import annotations

import mmap
import re
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType, quants

from specpipe.errors import SpecpipeError

SUPPORTED_ARCHS = ("llama", "qwen2")

# GGUF name -> mlx-lm module path; N is the layer index.
_LAYER_MAP = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_MAP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# GGML types mx.load reads exactly: F32, F16, Q4_0, Q4_1, Q8_0 (as triplets).
_MX_EXACT = {0, 1, 2, 3, 8}

# GGUF value types: id -> struct format (8 string, 9 array handled apart).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass
class Checkpoint:
    """A model read from one file: see the module docstring for the contract."""

    config: dict
    weights: dict[str, mx.array]
    quantization: dict[str, dict]
    tokenizer: Any  # transformers.PreTrainedTokenizerFast (imported lazily)
    eos_token_ids: list[int]
    metadata: dict = field(default_factory=dict)


@dataclass
class _TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (GGUF's ne reversed)
    ggml_type: int
    offset: int  # absolute byte offset in the file


def read_gguf(path: str | Path, on_tensor: Callable[[int], None] | None = None) -> Checkpoint:
    """Read a GGUF model file (llama or qwen2) into a `Checkpoint`.

    Args:
        path: the `.gguf` file.
        on_tensor: called with the number of tensors read so far since the last call (a progress bar).

    Returns:
        A `Checkpoint` whose config, weights and quantization feed
        `specpipe.engine.load.build.build_model`.

    Raises:
        SpecpipeError: missing or unreadable file, not GGUF, an unsupported
            architecture, tensor type, RoPE variant or tokenizer.
    """
    path = Path(path)
    meta, tensors = read_header(path)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise SpecpipeError(
            f"{path.name}: architecture {arch!r} is not supported; use a GGUF of one of: " + ", ".join(SUPPORTED_ARCHS)
        )
    config = _config(path, arch, meta, tensors)
    from specpipe.engine.load.gguf_tokenizer import build_tokenizer

    # Tokenizer first: its errors should not wait for gigabytes of tensors.
    tokenizer, eos_ids = build_tokenizer(meta, path.name)
    weights, quantization, route = _load_tensors(path, tensors, on_tensor or (lambda n: None))
    weights = _rename(path, weights)
    quantization = {_rename_module(k): v for k, v in quantization.items()}
    if arch == "llama":
        _unpermute_qk(weights, config)
    metadata = {
        "architecture": arch,
        "name": meta.get("general.name"),
        "size_label": meta.get("general.size_label"),
        "file_type": _file_type_name(meta.get("general.file_type")),
        "tensor_types": dict(Counter(_type_name(t.ggml_type) for t in tensors.values())),
        "tensor_route": route,
        "tokenizer": f"{meta.get('tokenizer.ggml.model')}/{meta.get('tokenizer.ggml.pre')}",
    }
    return Checkpoint(config, weights, quantization, tokenizer, eos_ids, metadata)


def read_header(path: str | Path) -> tuple[dict, dict[str, _TensorInfo]]:
    """Parse the key/values and tensor table of a GGUF file (v2 or v3).

    Args:
        path: the `.gguf` file.

    Returns:
        `(metadata, tensors)`: key -> value (arrays as lists), and tensor
        name -> `_TensorInfo` (numpy-order shape, GGML type, file offset).

    Raises:
        SpecpipeError: missing file, no GGUF magic, truncated or corrupt header.
    """
    path = Path(path)
    if not path.is_file():
        raise SpecpipeError(f"GGUF file not found: {path}; check the path or fetch the model first")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise SpecpipeError(f"{path} is not a GGUF file (no 'GGUF' magic bytes); pass a .gguf model file")
    with _mapped(path) as buf:
        try:
            meta, tensors = _parse(buf)
            size = len(buf)
        except (struct.error, IndexError, UnicodeDecodeError, KeyError, ValueError) as exc:
            raise SpecpipeError(f"{path} is a truncated or corrupt GGUF file ({exc}); download it again") from exc
    needed = max((_tensor_end(t) for t in tensors.values()), default=0)
    if needed > size:
        raise SpecpipeError(
            f"{path} is truncated: its tensors need {needed} bytes but the file has {size} "
            f"({size / needed:.0%}); download or copy it again"
        )
    return meta, tensors


@contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap]:
    """The file mapped read-only, closed on the way out -- unless a numpy view of it is still alive.

    A stop signal (Ctrl-C, SIGTERM) landing while `np.frombuffer` holds a view makes `mmap.close()`
    raise `BufferError: cannot close exported pointers exist`, which would replace the
    KeyboardInterrupt and end the command in a traceback; the map is freed with its last view instead.
    """
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError) as exc:
            raise SpecpipeError(f"cannot map {path}: {exc}; check the file is readable") from exc
    try:
        yield buf
    finally:
        try:
            buf.close()
        except BufferError:
            pass


def _tensor_end(t: _TensorInfo) -> int:
    """The byte just past tensor `t` in the file (0 for a type the gguf package does not know)."""
    try:
        byte_shape = quants.quant_shape_to_byte_shape(t.shape, GGMLQuantizationType(t.ggml_type))
    except (ValueError, KeyError):
        return 0
    return t.offset + int(np.prod(byte_shape))


def _parse(buf) -> tuple[dict, dict[str, _TensorInfo]]:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (only 2 and 3 are read)")
    pos = 24

    def string(p):
        (n,) = struct.unpack_from("<Q", buf, p)
        return buf[p + 8 : p + 8 + n].decode("utf-8"), p + 8 + n

    def value(vtype, p):
        if vtype in _SCALARS:
            fmt = "<" + _SCALARS[vtype]
            return struct.unpack_from(fmt, buf, p)[0], p + struct.calcsize(fmt)
        if vtype == 8:
            return string(p)
        if vtype != 9:
            raise ValueError(f"unknown value type {vtype}")
        itype, count = struct.unpack_from("<IQ", buf, p)
        p += 12
        if itype in _SCALARS and itype != 7:
            # Numeric arrays (token types, scores) in one go.
            dt = np.dtype("<" + _SCALARS[itype])
            arr = np.frombuffer(buf, dtype=dt, count=count, offset=p).tolist()
            return arr, p + dt.itemsize * count
        items = []
        for _ in range(count):
            item, p = value(itype, p)
            items.append(item)
        return items, p

    meta = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        meta[key], pos = value(vtype, pos + 4)
    infos = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        ne = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, tuple(reversed(ne)), ggml_type, offset))
    align = int(meta.get("general.alignment", 32))
    data_start = -(-pos // align) * align
    tensors = {n: _TensorInfo(n, s, t, data_start + o) for n, s, t, o in infos}
    return meta, tensors


def _config(path: Path, arch: str, meta: dict, tensors: dict[str, _TensorInfo]) -> dict:
    def get(key, default=None):
        v = meta.get(f"{arch}.{key}", default)
        if v is None:
            raise SpecpipeError(f"{path.name}: metadata key {arch}.{key} is missing; the GGUF is incomplete")
        return v

    if "token_embd.weight" not in tensors:
        raise SpecpipeError(f"{path.name}: no token_embd.weight tensor; this is not a complete model file")
    hidden, n_head = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // n_head))
    if int(meta.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise SpecpipeError(f"{path.name}: partial RoPE (rope.dimension_count != head_dim) is not supported")
    if "rope_freqs.weight" in tensors:
        raise SpecpipeError(f"{path.name}: per-dimension RoPE frequencies (Llama-3.1 style) are not supported")
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", n_head)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        # The embedding's row count is the truth; the vocab list may be padded or short.
        "vocab_size": int(tensors["token_embd.weight"].shape[0]),
        "rope_theta": float(get("rope.freq_base", 10000.0 if arch == "llama" else 1e6)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    if head_dim != hidden // n_head:
        config["head_dim"] = head_dim  # llama only; qwen2 in mlx-lm derives it
    if arch == "llama" and "blk.0.attn_q.bias" in tensors:
        config["attention_bias"] = True
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif scaling != "none":
        raise SpecpipeError(f"{path.name}: RoPE scaling {scaling!r} is not supported (only linear)")
    return config


def _load_tensors(path: Path, tensors: dict[str, _TensorInfo], on_tensor: Callable[[int], None]):
    """All tensors by GGUF name, the quantized triplets' params, and the route taken."""
    # mx.load (mlx 0.32) also accepts some K-quant files, converting them to
    # float16 -- and gets Q4_K wrong (|err| ~ |w|; Q6_K was right). So only
    # files made entirely of types it maps exactly go through it.
    if any(t.ggml_type not in _MX_EXACT for t in tensors.values()):
        return _dequantize_all(path, tensors, on_tensor), {}, "gguf-dequantized-float32"
    try:
        weights = mx.load(str(path))
    except (RuntimeError, ValueError):  # e.g. "[load_gguf] gguf_tensor_to_f16 failed"
        return _dequantize_all(path, tensors, on_tensor), {}, "gguf-dequantized-float32"
    on_tensor(len(tensors))  # mx.load maps them all at once
    quantization = {}
    for name, w in weights.items():
        if name.endswith(".scales"):
            base = name[: -len(".scales")]
            packed = weights[base + ".weight"]
            # A group of 32 values packs into `bits` uint32 words, one scale per group.
            quantization[base] = {"group_size": 32, "bits": packed.shape[-1] // w.shape[-1]}
    return weights, quantization, "mx.load"


def _dequantize_all(
    path: Path, tensors: dict[str, _TensorInfo], on_tensor: Callable[[int], None]
) -> dict[str, mx.array]:
    out = {}
    with _mapped(path) as buf:
        for t in tensors.values():
            try:
                qtype = GGMLQuantizationType(t.ggml_type)
                byte_shape = quants.quant_shape_to_byte_shape(t.shape, qtype)
                raw = np.frombuffer(buf, np.uint8, int(np.prod(byte_shape)), t.offset).reshape(byte_shape)
                arr = quants.dequantize(raw, qtype)
            except (ValueError, KeyError, NotImplementedError) as exc:
                raise SpecpipeError(
                    f"{path.name}: tensor {t.name} has type {_type_name(t.ggml_type)} which cannot be "
                    "dequantized; use a Q4_0/Q4_1/Q8_0/K-quant/F16 GGUF"
                ) from exc
            # One float32 copy in MLX at a time; the numpy buffer dies each iteration.
            out[t.name] = mx.array(arr.astype(np.float32, copy=False).reshape(t.shape))
            mx.eval(out[t.name])
            del raw, arr
            on_tensor(1)
    return out


def _rename_module(gguf_base: str) -> str | None:
    """'blk.3.attn_q' -> 'model.layers.3.self_attn.q_proj'; None when unknown."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", gguf_base)
    if m and m.group(2) in _LAYER_MAP:
        return f"model.layers.{m.group(1)}.{_LAYER_MAP[m.group(2)]}"
    return _GLOBAL_MAP.get(gguf_base)


def _rename(path: Path, weights: dict[str, mx.array]) -> dict[str, mx.array]:
    out = {}
    for name in list(weights):
        base, _, suffix = name.rpartition(".")
        module = _rename_module(base)
        if module is None:
            raise SpecpipeError(
                f"{path.name}: tensor {name!r} has no mlx-lm counterpart; this GGUF variant is unsupported"
            )
        out[f"{module}.{suffix}"] = weights.pop(name)
    return out


def _unpermute_qk(weights: dict[str, mx.array], config: dict) -> None:
    """Undo convert_hf_to_gguf's Q/K row permutation (per head: halves -> interleaved).

    The converter did `w.reshape(n_head, 2, hd // 2, ...).swapaxes(1, 2)`;
    the inverse reshapes to (n_head, hd // 2, 2, ...) and swaps back. Rows
    are output features, so a quantized triplet's weight, scales and biases
    (and a bias vector) are permuted alike.
    """
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    for name, w in weights.items():
        proj = name.split(".")[-2]
        if proj in heads:
            n = heads[proj]
            rest = w.shape[1:]
            weights[name] = w.reshape(n, w.shape[0] // n // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type{ggml_type}"


def _file_type_name(file_type) -> str | None:
    try:
        return None if file_type is None else LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        return str(file_type)
