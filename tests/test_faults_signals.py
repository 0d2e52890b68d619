"""No stop signal is lost at start-up (issue 49): about 1 in 100 SIGTERMs sent 0.6-1.5 s after start was swallowed
under Hydra's override parser, the run finished with exit 0 and ignored every later signal. A stop inside Hydra's
start now waits for the task's start, one swallowed anywhere is raised at the next load or step boundary, and a
second signal always raises. Rows in docs/faults.md (the table test in test_faults.py reads this module too)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from test_faults import ENV, error_line

SWALLOWED = """
import os, signal, time
from specpipe.run import signals
signals.install()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
except KeyboardInterrupt:
    pass  # swallowed where it landed, as C code or a library's bare except does
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("second ignored")
except KeyboardInterrupt:
    print("second raised")
try:
    signals.check()
    print("lost")
except KeyboardInterrupt:
    print("raised at the boundary", signals.exit_code())
"""


def test_a_swallowed_stop_is_raised_at_the_next_boundary_and_a_second_signal_raises():
    proc = subprocess.run([sys.executable, "-c", SWALLOWED], capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.stdout.split("\n")[:2] == ["second raised", "raised at the boundary 143"], proc.stdout + proc.stderr


IN_A_FINALIZER = """
import os, signal, time
from specpipe.run import signals
signals.install()

class Finalized:
    def __del__(self):  # a library's finalizer (regex's Group.__del__ in CI) running when the signal lands
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)

Finalized()
try:
    signals.check()
    print("lost")
except KeyboardInterrupt:
    print("raised at the boundary", signals.exit_code())
"""


def test_a_stop_landing_in_a_finalizer_prints_no_traceback_and_is_raised_at_the_next_boundary():
    """CI at stop 59: SIGTERM landed in a `__del__`, Python printed "Exception ignored ... Traceback" above the
    one error line. The stop is recorded and raised at the boundary; the finalizer's copy is not printed."""
    proc = subprocess.run([sys.executable, "-c", IN_A_FINALIZER], capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.stdout.strip() == "raised at the boundary 143", proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr


def sigterm_at(delay_s: float, cwd) -> tuple[int, str]:
    """`specpipe` on the tiny model, SIGTERM `delay_s` after its start: (exit code, stderr)."""
    args = ["model=tiny-random", "max_tokens=400", "prompt.text=hi", "draft=none"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "specpipe.cli", *args],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay_s)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def assert_stopped(code: int, err: str, delay_s: float) -> None:
    assert code == 143, f"SIGTERM {delay_s:.2f} s after start: exit {code}\n{err}"
    if "tokens (interrupted by SIGTERM)" in err:  # generation had started: its summary line, after the header
        assert err.strip().splitlines()[-1].startswith("-- "), err
        return
    assert error_line(err).startswith("specpipe: error: stopped by SIGTERM"), err


@pytest.mark.parametrize("delay_s", [0.3, 0.6, 0.9, 1.2, 1.5, 2.0])
def test_sigterm_at_any_start_up_moment_is_143_and_one_line(tmp_path, delay_s):
    """A few moments across the start (imports, the override check, Hydra's start, the load, the first steps);
    the 600-signal sweep is the statistical test below."""
    assert_stopped(*sigterm_at(delay_s, tmp_path), delay_s)


@pytest.mark.statistical
def test_six_hundred_timed_start_up_sigterms(tmp_path):
    """`python -m pytest -q -m statistical tests/test_faults_signals.py` (about 15-20 min on 2 cores): 600
    SIGTERMs at random moments 0.3-2 s after start, each must end with 143 and one line."""
    rng = random.Random(49)
    count = int(os.environ.get("SPECPIPE_SIGTERMS", "600"))
    for _ in range(count):
        delay_s = rng.uniform(0.3, 2.0)
        assert_stopped(*sigterm_at(delay_s, tmp_path), delay_s)
