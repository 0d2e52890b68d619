"""A safetensors file's header checked against the file before MLX reads it: a cut, foreign or crafted file is
one line, never a read past the end or an allocation the header invents.

Contract: `check_safetensors(path)` reads the 8-byte header length and the JSON header only, and raises
SpecpipeError naming the file, the tensor and the allowed range when the header is not JSON, a dtype is not
one of safetensors', a shape is not non-negative integers, or a tensor's data_offsets do not lie inside the
data and match its shape's byte count. Nothing is loaded.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from specpipe.errors import SpecpipeError

ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2}
ITEM_BYTES |= {"I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
FIX = "re-download or re-export the checkpoint"


def check_safetensors(path: Path) -> None:
    """Raise SpecpipeError (one line) unless every tensor of `path`'s header lies inside its data."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
                raise SpecpipeError(
                    f"{path}: not a safetensors file (header length {length}, file {size} bytes): {FIX}"
                )
            header = json.loads(f.read(length).decode("utf-8"))
    except OSError as exc:
        raise SpecpipeError(f"{path}: cannot be read ({exc.strerror}): {FIX}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise SpecpipeError(f"{path}: its safetensors header is not JSON: {FIX}") from None
    if not isinstance(header, dict):
        raise SpecpipeError(f"{path}: its safetensors header is a {type(header).__name__}, not a table: {FIX}")
    data_bytes = size - 8 - length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        _check_tensor(path, str(name), info, data_bytes)


def _check_tensor(path: Path, name: str, info, data_bytes: int) -> None:
    if not isinstance(info, dict):
        raise SpecpipeError(f"{path}: tensor {name} has no dtype / shape / data_offsets: {FIX}")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in ITEM_BYTES:
        raise SpecpipeError(f"{path}: tensor {name} has dtype {dtype!r}: allowed {', '.join(ITEM_BYTES)}: {FIX}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise SpecpipeError(f"{path}: tensor {name} has shape {shape!r}: allowed non-negative integers: {FIX}")
    valid = (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
    )
    if not valid:
        raise SpecpipeError(
            f"{path}: tensor {name} has data_offsets {offsets!r}: allowed 0 <= begin <= end <= {data_bytes} "
            f"(the file's data): {FIX}"
        )
    begin, end = offsets  # type: ignore[misc]  # a list of two ints, checked above
    need = math.prod(shape) * ITEM_BYTES[dtype]
    if end - begin != need:
        raise SpecpipeError(
            f"{path}: tensor {name} of shape {tuple(shape)} {dtype} needs {need} bytes, its data_offsets span "
            f"{end - begin}: {FIX}"
        )
