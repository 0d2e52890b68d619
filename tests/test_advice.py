"""Start-of-run warnings for settings the cost model predicts slower than plain decoding (specpipe/advice.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from specpipe.advice import break_even, draft_cannot_pay, slow_on_cpu
from specpipe.costmodel.calibration import expected_speedup, interpolate


def test_a_layer_skip_depth_the_cost_model_prices_slower_than_plain_is_said_with_the_acceptance_it_needs():
    # SmolLM2, draft.depth=12: c = 0.53 of a step per drafted token, K = 8, T(9)/T(1) = 1.5: 5.7 plain steps for
    # at most 9 tokens, so the old full-acceptance rule said nothing; at budget=auto's prior (50%) it is 0.35x
    curve = interpolate({1: 1.0, 2: 1.05, 3: 1.1, 9: 1.5, 33: 3.0})  # T(n)/T(1) at every n, as calibrations hold
    line = draft_cannot_pay("layerskip", 0.53, 8, curve)
    assert "draft=layerskip costs 0.53" in line and "budget.k=8 costs 5.7 plain steps" in line
    assert "pays only if the target accepts over 88% of drafted tokens" in line and "predicted 0.35x" in line
    assert "at 50%, budget=auto's prior" in line and "budget=auto" in line
    need = break_even(8, 0.53, curve)  # at the acceptance named, K = 8 pays exactly
    assert abs(expected_speedup(need, 8, 0.53, curve) - 1.0) < 1e-6
    # a smaller K that pays at the prior is named (K = 2: 0.97x; K = 1: 1.07x)
    assert "use budget.k=1 (1.07x at 50%)" in draft_cannot_pay("layerskip", 0.35, 2, curve)
    # a trained early exit the user knows accepts 90%: the prior is the user's to give
    assert draft_cannot_pay("layerskip", 0.53, 8, curve, prior=0.9) == ""


def test_a_draft_slower_even_at_full_acceptance_is_said_and_a_cheap_one_is_not():
    line = draft_cannot_pay("layerskip", 0.9, 8, interpolate({1: 1.0, 9: 2.0, 33: 4.0}))  # 9.2 plain steps for 9 tokens
    assert "budget.k=8 costs 9.2 plain steps for at most 9 tokens, slower than plain even if every" in line
    assert draft_cannot_pay("mtp", 0.05, 4, interpolate({1: 1.0, 5: 1.3, 33: 3.0})) == ""  # 1.29x at 50%: it can pay
    assert draft_cannot_pay("ngram", None, 8, None) == ""  # no cost hint (model-free drafters): nothing to say
    # no calibration: a verify is priced as one plain step, the cheapest it can be; still 0.4x at 50%
    assert "predicted 0.40x" in draft_cannot_pay("layerskip", 0.5, 8, None)


def test_a_fixed_k_layer_skip_run_warns_and_budget_auto_does_not(tmp_path):
    env = {**os.environ, "SPECPIPE_CACHE": str(tmp_path / "cache")}  # no cached curve: verify priced at 1 step

    def stderr(*args):
        cmd = [sys.executable, "-m", "specpipe.cli", "model=tiny-random", "max_tokens=4", "prompt.text=ab ab"]
        proc = subprocess.run([*cmd, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        return [n for n in proc.stderr.splitlines() if n.startswith("specpipe: warning: ")]

    # tiny-random has 2 layers: depth 1 reads half the bytes, c = 0.50; K = 8 costs 5.0 steps, fine at 100%
    (warned,) = stderr("draft=layerskip", "draft.depth=1", f"output_dir={tmp_path / 'fixed'}")
    assert "draft=layerskip costs 0.50" in warned and "pays only if the target accepts over" in warned
    assert not stderr("draft=layerskip", "draft.depth=1", "budget=auto", f"output_dir={tmp_path / 'auto'}")


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
