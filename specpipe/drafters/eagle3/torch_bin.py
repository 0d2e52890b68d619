"""Read a `pytorch_model.bin` (torch.save's zip format) into numpy arrays, without torch.

Contract: `read_bin(path)` returns {name: np.ndarray} for a state dict of plain tensors
(float32 / float16 / bfloat16 as float32 / int64 / int32 / bool). The pickle is read
with an unpickler that resolves only the handful of names a state dict uses (the
tensor rebuild function, the storage types, OrderedDict) and refuses every other
global, so a checkpoint cannot run code here; each tensor's size, stride and offset are checked against its
storage before a view is built, and a compressed member is refused, so one cannot read or write outside
its buffer or inflate to gigabytes either. The original EAGLE-3 heads
(yuhuili/EAGLE3-LLaMA3.1-Instruct-8B) ship this format; the layout is torch's
`torch/serialization.py` (`_save`: `<prefix>/data.pkl` + `<prefix>/data/<key>`).
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path

import numpy as np

from specpipe.errors import SpecpipeError

MAX_PICKLE_BYTES = 64 << 20  # the pickle holds names, sizes and strides only: a few KiB per tensor
# torch storage class name -> numpy dtype of its bytes (bfloat16 is widened after reading)
_STORAGES = {
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "BFloat16Storage": np.uint16,
    "DoubleStorage": np.float64,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _Storage:
    def __init__(self, name: str):
        self.name = name


def _rebuild_tensor_v2(storage, offset, size, stride, *_rest):
    """The tensor as a copy of its storage's elements, after checking that every element it reads lies inside
    the storage: `as_strided` trusts its arguments and would read (and the copy write) past the buffer.

    Example: a storage of 6 floats, offset 2, size (2, 2), stride (2, 1) reads elements 2, 3, 4, 5: allowed;
    stride (3, 1) would read element 2 + 3 + 1 = 6: refused.
    """
    if not (isinstance(storage, tuple) and len(storage) == 2 and isinstance(storage[0], np.ndarray)):
        raise ValueError(f"a tensor without a storage ({type(storage).__name__})")
    array, name = storage
    shape, steps = _ints(size, "size"), _ints(stride, "stride")
    if len(shape) != len(steps) or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"a tensor of size {size}, stride {stride} at offset {offset!r}: malformed")
    count = int(np.prod(shape, dtype=object)) if shape else 1
    if count:
        last = offset + sum((n - 1) * step for n, step in zip(shape, steps, strict=True))
        if last >= len(array) or count > len(array):
            raise ValueError(
                f"a tensor of size {tuple(shape)}, stride {tuple(steps)} at offset {offset} reads element {last} "
                f"({count} elements) of a storage of {len(array)}: allowed only elements 0..{len(array) - 1}"
            )
    itemsize = array.itemsize
    out = np.lib.stride_tricks.as_strided(
        array[offset:], shape=tuple(shape), strides=tuple(step * itemsize for step in steps)
    ).copy()
    if name == "BFloat16Storage":  # the top 16 bits of a float32
        out = (out.astype(np.uint32) << 16).view(np.float32)
    return out


def _ints(values, what: str) -> list[int]:
    """`values` as non-negative ints (torch's sizes and strides are), else ValueError."""
    if not isinstance(values, (tuple, list)) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**48 for v in values
    ):
        raise ValueError(f"a tensor {what} {values!r}: expected non-negative integers")
    return list(values)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, archive: zipfile.ZipFile, prefix: str):
        super().__init__(file)
        self.archive, self.prefix = archive, prefix

    def find_class(self, module, name):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch" and name in _STORAGES:
            return _Storage(name)
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain state dict")

    def persistent_load(self, pid):
        # ('storage', storage type, key, location, numel)
        _, storage, key, _location, _numel = pid
        name = storage.name if isinstance(storage, _Storage) else str(storage)
        if name not in _STORAGES:
            raise pickle.UnpicklingError(f"storage type {name} is not supported")
        member = self.archive.getinfo(f"{self.prefix}data/{key}")
        if member.compress_type != zipfile.ZIP_STORED:  # torch stores them; a deflated one may inflate to GBs
            raise ValueError(f"storage {key} is compressed (torch.save stores tensors uncompressed)")
        data = self.archive.read(member)
        dtype = np.dtype(_STORAGES[name])
        return np.frombuffer(data[: len(data) - len(data) % dtype.itemsize], dtype=dtype), name


def read_bin(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a torch.save'd state dict (see the module docstring).

    Raises:
        SpecpipeError naming the file and what it holds instead.
    """
    if not zipfile.is_zipfile(path):
        raise SpecpipeError(
            f"{path}: not torch.save's zip format (a pre-1.6 torch file?): convert it to model.safetensors"
        )
    with zipfile.ZipFile(path) as archive:
        pkl = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
        if pkl is None:
            raise SpecpipeError(f"{path}: a zip without data.pkl, not a torch.save'd state dict")
        prefix = pkl[: -len("data.pkl")]
        if archive.getinfo(pkl).file_size > MAX_PICKLE_BYTES:
            raise SpecpipeError(
                f"{path}: data.pkl is {archive.getinfo(pkl).file_size} bytes; a state dict's index is at most "
                f"{MAX_PICKLE_BYTES}: not a plain state dict, convert it to safetensors"
            )
        try:
            with archive.open(pkl) as f:
                state = _Unpickler(f, archive, prefix).load()
        except (
            pickle.UnpicklingError, ValueError, KeyError, TypeError, IndexError, AttributeError, EOFError,
            OverflowError, RecursionError, zipfile.BadZipFile, OSError,
        ) as e:  # fmt: skip
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise SpecpipeError(
                f"{path}: not a plain state dict of tensors ({first}): convert it to safetensors"
            ) from e
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise SpecpipeError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
    return dict(state)
