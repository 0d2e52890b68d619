"""Start-of-run warnings for settings the cost model predicts slower than plain decoding (specpipe/advice.py)."""

from __future__ import annotations

import subprocess
import sys

from specpipe.advice import draft_cannot_pay, slow_on_cpu


def test_a_layer_skip_depth_that_cannot_pay_even_at_full_acceptance_is_said():
    # c = 0.9 of a plain step per drafted token, K = 8, T(9)/T(1) = 2: 9.2 plain steps for at most 9 tokens
    line = draft_cannot_pay("layerskip", 0.9, 8, {1: 1.0, 9: 2.0, 33: 4.0})
    assert "draft=layerskip" in line and "K=8 costs 9.2 plain steps for at most 9 tokens" in line
    assert draft_cannot_pay("layerskip", 0.5, 8, {1: 1.0, 9: 2.0}) == ""  # 6.0 < 9: can pay
    # no curve: a verify is priced at one plain step, the cheapest it can be (no false alarm)
    assert draft_cannot_pay("layerskip", 0.9, 8, None) == "" and draft_cannot_pay("layerskip", 1.0, 8, None)
    assert draft_cannot_pay("ngram", None, 8, None) == ""  # no cost hint: nothing to say


def test_a_quantized_or_half_target_on_cpu_is_said_and_float32_or_a_gpu_is_not():
    assert "q4 on CPU" in slow_on_cpu("Device(cpu, 0)", "q4") and "quant=auto (float32)" in slow_on_cpu("cpu", "q8")
    assert slow_on_cpu("Device(cpu, 0)", "float32") == "" and slow_on_cpu("Device(gpu, 0)", "q4") == ""


def test_the_warning_is_one_line_after_the_header(tmp_path):
    def stderr(*args):
        cmd = [sys.executable, "-m", "specpipe.cli", "model=tiny-random", "max_tokens=4", "prompt.text=ab ab", *args]
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr.splitlines()

    lines = stderr("quant=bfloat16", f"output_dir={tmp_path / 'half'}")
    warned = [n for n in lines if n.startswith("specpipe: warning: ")]
    assert len(warned) == 1 and "bfloat16 on CPU" in warned[0] and lines.index(warned[0]) == 1
    assert not [n for n in stderr(f"output_dir={tmp_path / 'f32'}") if n.startswith("specpipe: warning")]
