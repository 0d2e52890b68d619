"""torch.save's zip format written without torch, opcode by opcode, so tests can craft any size, stride, offset
or storage a hostile `pytorch_model.bin` may hold (specpipe/drafters/eagle3/torch_bin.py reads them)."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np


def _int(value: int) -> bytes:
    if 0 <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data  # LONG1: any int, negative ones too


def _text(value: str) -> bytes:
    data = value.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _tuple(values) -> bytes:
    return b"(" + b"".join(_int(v) for v in values) + b"t"


def write_torch_zip(
    path: Path, tensors: dict[str, tuple[np.ndarray, int, tuple, tuple]], compress: bool = False
) -> Path:
    """`path` holding {name: (float32 storage, offset, size, stride)} as torch.save writes a state dict."""
    pickle = b"\x80\x02}"
    for key, (name, (_storage, offset, size, stride)) in enumerate(tensors.items()):
        storage_id = b"(" + _text("storage") + b"ctorch\nFloatStorage\n" + _text(str(key)) + _text("cpu")
        storage_id += _int(len(_storage)) + b"tQ"
        pickle += _text(name) + b"ctorch._utils\n_rebuild_tensor_v2\n("
        pickle += storage_id + _int(offset) + _tuple(size) + _tuple(stride) + b"\x89tRs"
    pickle += b"."
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle)
        how = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
        for key, (storage, *_) in enumerate(tensors.values()):
            archive.writestr(f"archive/data/{key}", np.asarray(storage, np.float32).tobytes(), compress_type=how)
    return path
