"""Loading says what it will need before it starts and shows progress on a terminal (issue 51)."""

from __future__ import annotations

import io
import math

import pytest
from test_gguf import write_tiny

import specpipe.engine.load.load_progress as lp
from specpipe.engine.load.gguf import read_header
from specpipe.engine.load.loader import load_engine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def kquant_gguf(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("progress") / "tiny-q4k.gguf", "qwen2", kquants_only=True)


def test_a_kquant_file_is_priced_at_float32(kquant_gguf):
    tensors = read_header(kquant_gguf)[1]
    params = sum(math.prod(t.shape) for t in tensors.values())
    # dequantized to float32 whatever the precision asked: 4 bytes a parameter, more than the file
    assert lp.gguf_bytes_needed(kquant_gguf, tensors, "stored") == params * 4 > kquant_gguf.stat().st_size


def test_the_memory_notice_says_need_and_have_only_when_it_will_not_fit():
    assert lp.memory_notice("m", needed=1 << 30, available=4 << 30) == ""
    line = lp.memory_notice("qwen2.5-coder-1.5b", needed=6 << 30, available=3 << 30)
    assert "needs about 6.0 GiB" in line and "3.0 GiB available" in line and "quant=stored" in line
    assert lp.available_bytes() is None or lp.available_bytes() > 0


def test_a_load_that_will_not_fit_is_warned_about_before_it_starts(kquant_gguf, monkeypatch, capsys):
    from specpipe.engine.load import gguf

    seen_before_tensors = []
    real = gguf._load_tensors

    def load_tensors(*args):
        seen_before_tensors.append(capsys.readouterr().err)
        return real(*args)

    monkeypatch.setattr(lp, "available_bytes", lambda: 1 << 20)
    monkeypatch.setattr(gguf, "_load_tensors", load_tensors)
    load_engine(path=str(kquant_gguf), precision="float32")
    assert "warning: loading tiny-q4k needs about" in seen_before_tensors[0]
    assert "1.0 MiB" not in seen_before_tensors[0] and "0.0 GiB available" in seen_before_tensors[0]


def test_progress_counts_tensors_on_a_terminal_and_stays_quiet_off_one(kquant_gguf, monkeypatch):
    n = len(read_header(kquant_gguf)[1])
    steps = []
    real_step = lp.LoadProgress.step
    monkeypatch.setattr(lp.LoadProgress, "step", lambda self, k=1: (steps.append(k), real_step(self, k)))
    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(lp.sys, "stderr", stream)
        steps.clear()
        load_engine(path=str(kquant_gguf), precision="float32")
        text = stream.getvalue()
        assert sum(steps) == n  # every tensor dequantized is one step of the bar
        assert ("loading tiny-q4k:" in text and f"/{n} " in text) is shown, text
        assert shown or text == ""  # a log file gets no carriage returns
