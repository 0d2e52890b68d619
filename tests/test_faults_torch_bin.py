"""A crafted `pytorch_model.bin` is data: sizes, strides and offsets that reach outside a tensor's storage, and
compressed members, are one line naming the file (they were reads and writes outside numpy's buffers, exit 139).
Rows in docs/faults.md (the table test in test_faults.py reads this module too)."""

from __future__ import annotations

import numpy as np
import pytest
from eagle3_tiny import head_config, random_weights, write
from test_faults import error_line, run_cli
from torch_zip import write_torch_zip

from specpipe.drafters.eagle3.torch_bin import read_bin
from specpipe.errors import SpecpipeError

SIX = np.arange(6, dtype=np.float32)
OUTSIDE = {
    "stride past the end": ((SIX, 2, (2, 2), (3, 1)), "reads element 6"),
    "offset past the end": ((SIX, 100, (1,), (1,)), "reads element 100"),
    "a billion elements by stride 0": ((SIX, 0, (10**9,), (0,)), "1000000000 elements"),
    "huge stride": ((SIX, 0, (2,), (2**40,)), "reads element 1099511627776"),
    "negative stride": ((SIX, 5, (2,), (-1,)), "expected non-negative integers"),
    "size and stride of other ranks": ((SIX, 0, (2, 3), (1,)), "malformed"),
}


def test_a_tensor_inside_its_storage_is_read(tmp_path):
    """The checks pass what torch writes: a view at an offset with row strides, and an empty tensor."""
    path = write_torch_zip(tmp_path / "ok.bin", {"a": (SIX, 2, (2, 2), (2, 1)), "empty": (SIX, 6, (0, 4), (4, 1))})
    tensors = read_bin(path)
    assert tensors["a"].tolist() == [[2, 3], [4, 5]] and tensors["empty"].shape == (0, 4)


@pytest.mark.parametrize("case", sorted(OUTSIDE))
def test_a_tensor_outside_its_storage_is_one_line(tmp_path, case):
    tensor, words = OUTSIDE[case]
    path = write_torch_zip(tmp_path / "pytorch_model.bin", {"fc.weight": tensor})
    with pytest.raises(SpecpipeError) as refused:
        read_bin(path)
    message = str(refused.value)
    assert str(path) in message and words in message and "\n" not in message, message


def test_a_compressed_storage_is_refused(tmp_path):
    """torch.save stores tensors uncompressed; a deflated member may inflate to gigabytes before any check."""
    path = write_torch_zip(tmp_path / "pytorch_model.bin", {"fc.weight": (SIX, 0, (6,), (1,))}, compress=True)
    with pytest.raises(SpecpipeError, match="compressed"):
        read_bin(path)


def test_a_crafted_eagle3_bin_through_the_cli_is_one_line(tmp_path):
    """The issue's repro: an EAGLE-3 head folder whose pytorch_model.bin strides outside its storage ended in
    SIGSEGV (exit 139, no message); it is now exit 1 with one line, nothing generated."""
    cfg = head_config()
    folder = write(tmp_path / "head", "eagle", cfg, random_weights(cfg))
    (folder / "model.safetensors").unlink()
    write_torch_zip(folder / "pytorch_model.bin", {"fc.weight": (SIX, 0, (1 << 20, 1 << 20), (1 << 21, 1))})
    deep = ["model=tiny-random", "+model.tiny.num_hidden_layers=8", "draft=eagle3", "max_tokens=4", "prompt.text=hi"]
    proc = run_cli([*deep, f"draft.path={folder}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "pytorch_model.bin" in error_line(proc.stderr) and proc.stdout == ""
