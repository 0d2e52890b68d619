"""A stop signal that lands while a model loads is one line and 130 / 143, never a traceback.

The K-quant GGUF route dequantizes each tensor from a numpy view of the file's mmap; a
KeyboardInterrupt raised while that view is alive used to turn into `BufferError: cannot close
exported pointers exist` (issue 51). The signal here is real (the process sends it to itself
from inside the dequantization of the third tensor), so it lands exactly where a user's Ctrl-C did.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_faults import ENV, default_stop_signals, error_line
from test_gguf import write_tiny

# Runs `specpipe model.path=<gguf>` in a child whose third dequantized tensor sends it `signum`.
CHILD = textwrap.dedent(
    """
    import os, sys
    import specpipe.engine.load.gguf as reader

    signum, calls = int(sys.argv[1]), []
    real = reader.quants.dequantize

    def dequantize(raw, qtype):
        calls.append(qtype)
        if len(calls) == 3:
            os.kill(os.getpid(), signum)
        return real(raw, qtype)

    reader.quants.dequantize = dequantize
    sys.argv = ["specpipe", f"model.path={sys.argv[2]}", "draft=none", "max_tokens=2", "prompt.text=hi"]
    from specpipe.cli.generate import main

    main()
    """
)


@pytest.fixture(scope="module")
def kquant_gguf(tmp_path_factory) -> Path:
    path = write_tiny(tmp_path_factory.mktemp("kquant") / "tiny-q4k.gguf", "qwen2", kquants_only=True)
    from specpipe.engine.load.gguf import read_header

    _, tensors = read_header(path)
    assert {t.ggml_type for t in tensors.values()} & {12, 14}  # Q4_K, Q6_K: the dequantize route
    return path


@pytest.mark.parametrize(("signum", "code", "said"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_stop_during_a_kquant_load_is_one_line(kquant_gguf, tmp_path, signum, code, said):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(int(signum)), str(kquant_gguf)],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=default_stop_signals,
    )
    line = error_line(proc.stderr)
    assert "BufferError" not in proc.stderr
    assert f"stopped by {said}" in line
    assert proc.returncode == code, proc.stderr


def test_the_reader_lets_the_interrupt_through(kquant_gguf, monkeypatch):
    """In-process: the KeyboardInterrupt itself leaves read_gguf, not the mmap's BufferError."""
    import specpipe.engine.load.gguf as reader

    def interrupted(raw, qtype):
        raise KeyboardInterrupt

    monkeypatch.setattr(reader.quants, "dequantize", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reader.read_gguf(kquant_gguf)
