"""Read a `pytorch_model.bin` (torch.save's zip format) into numpy arrays, without torch.

Contract: `read_bin(path)` returns {name: np.ndarray} for a state dict of plain tensors
(float32 / float16 / bfloat16 as float32 / int64 / int32 / bool). The pickle is read
with an unpickler that resolves only the handful of names a state dict uses (the
tensor rebuild function, the storage types, OrderedDict) and refuses every other
global, so a checkpoint cannot run code here. The original EAGLE-3 heads
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
    array, name = storage
    itemsize = array.itemsize
    out = np.lib.stride_tricks.as_strided(
        array[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride)
    ).copy()
    if name == "BFloat16Storage":  # the top 16 bits of a float32
        out = (out.astype(np.uint32) << 16).view(np.float32)
    return out


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
        data = self.archive.read(f"{self.prefix}data/{key}")
        return np.frombuffer(data, dtype=_STORAGES[name]), name


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
        with archive.open(pkl) as f:
            try:
                state = _Unpickler(f, archive, prefix).load()
            except (pickle.UnpicklingError, ValueError, KeyError) as e:
                raise SpecpipeError(
                    f"{path}: not a plain state dict of tensors ({e}): convert it to safetensors"
                ) from e
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise SpecpipeError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
    return dict(state)
