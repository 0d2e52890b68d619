"""Fault injection: concurrent runs, full disks, stop signals, broken pipes,
corrupt model files and bad values. Each test asserts the one line the user
sees, the exit code, and what was kept. docs/faults.md lists every fault with
the test that checks it (test_the_fault_table_names_a_test_for_every_row)."""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_module
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specpipe.events import RunFinished, read_events, read_recording

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=tiny-random", "prompt.text=ab ab ab ab"]
# big enough that a step takes milliseconds, so a signal lands mid-generation
SLOW_TINY = [
    "model=tiny-random",
    "+model.tiny.num_hidden_layers=8",
    "+model.tiny.hidden_size=256",
    "+model.tiny.intermediate_size=1024",
    "draft=none",
    "prompt.text=hi",
]
# a stream that runs until stopped: room past the tiny model's 4096 positions, which the context check enforces
ENDLESS = [*SLOW_TINY, "max_tokens=100000", "+model.tiny.max_position_embeddings=1000000"]
ENV = dict(os.environ, PYTHONUNBUFFERED="1")


def start(module: str, args: list[str], cwd: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=ENV,
        text=True,
        stdout=kw.pop("stdout", subprocess.PIPE),
        stderr=subprocess.PIPE,
        preexec_fn=default_stop_signals,
        **kw,
    )


def default_stop_signals() -> None:
    # a runner started in the background ignores SIGINT, one under nohup SIGHUP (the SIGHUP case then ran on
    # for 120 s, as documented for an ignored signal): the child must not inherit either
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def run_cli(args: list[str], cwd: Path, module: str = "specpipe.cli") -> subprocess.CompletedProcess:
    return run_module(module, args, cwd, ENV)


def error_line(stderr: str, tool: str = "specpipe") -> str:
    """The stderr of a failed command must be exactly one line (no traceback): return it."""
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith(f"{tool}: error: "), lines[0]
    return lines[0]


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def assert_kept(folder: Path, stop_reason: str) -> dict:
    """summary.json says `stop_reason` and matches events.jsonl, whose every line is whole."""
    summary = json.loads((folder / "summary.json").read_text())
    events = read_events(folder / "events.jsonl")
    assert summary["stop_reason"] == stop_reason
    assert isinstance(events[-1], RunFinished) and events[-1].token_ids == summary["tokens"]
    return summary


# ---------------------------------------------------------------- run folders


def test_concurrent_runs_into_one_folder(tmp_path):
    folder = tmp_path / "D"
    first = start(
        "specpipe.cli", [*SLOW_TINY, "max_tokens=300", f"hydra.run.dir={folder}"], tmp_path, stdout=subprocess.DEVNULL
    )
    wait_for(lambda: (folder / "events.jsonl").exists())
    second = run_cli([*TINY, "max_tokens=8", "sampling=sample", "sampling.seed=2", f"hydra.run.dir={folder}"], tmp_path)
    assert second.returncode == 2
    assert "in use by another run" in error_line(second.stderr)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    summary = assert_kept(folder, "max_tokens")
    assert len(summary["tokens"]) == 300 and summary["seed"] == 0  # the first run's, untouched


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    from specpipe.run.run_folder import claim_fresh, release

    a = claim_fresh(tmp_path / "12-00-00")
    b = claim_fresh(tmp_path / "12-00-00")  # the default folder's name is the same within one second
    assert (a.name, b.name) == ("12-00-00", "12-00-00-2")
    release(a), release(b)


def test_unwritable_run_folder(tmp_path):
    (tmp_path / "a-file").write_text("x")
    for folder in ("/proc/x", str(tmp_path / "a-file" / "run")):
        proc = run_cli([*TINY, f"hydra.run.dir={folder}"], tmp_path)
        assert proc.returncode == 2
        assert "cannot create the run folder" in error_line(proc.stderr)


def test_read_only_run_folder(tmp_path):
    from specpipe.errors import ConfigError
    from specpipe.run.run_folder import claim

    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(folder, 0o500)
    try:
        if os.access(folder, os.W_OK):  # root ignores permissions: a read-only mount is the real case
            if subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "ro,size=4k", "tmpfs", str(folder)], capture_output=True
            ).returncode:
                pytest.skip("running as root without mount: cannot make a folder read-only")
        with pytest.raises(ConfigError, match="is not writable"):
            claim(folder)
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)
        os.chmod(folder, 0o700)


def test_a_finished_run_folder_is_never_overwritten(tmp_path):
    folder = tmp_path / "D"
    first = run_cli([*TINY, "max_tokens=4", f"hydra.run.dir={folder}"], tmp_path)
    assert first.returncode == 0, first.stderr
    kept = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    again = run_cli([*TINY, "max_tokens=8", "sampling.seed=2", f"hydra.run.dir={folder}"], tmp_path)
    assert again.returncode == 2
    assert "holds an earlier run (events.jsonl, summary.json)" in error_line(again.stderr)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == kept  # .hydra/ included


def _full_tmpfs(mnt: Path) -> None:
    """A tiny tmpfs at `mnt`, filled to the last block (skip where mounting is not allowed); the caller unmounts."""
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    with open(mnt / "fill", "wb", buffering=0) as f:
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_run_folder_on_a_full_disk(tmp_path):
    """Hydra writes .hydra/ before any of specpipe's code runs: the full disk is found before it does."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    try:
        _full_tmpfs(mnt)
        for args in ([f"hydra.run.dir={mnt / 'run'}"], []):  # a named folder, and the default one under outputs/
            proc = run_cli([*TINY, "max_tokens=4", *args], mnt)
            assert proc.returncode == 2, proc.stderr
            line = error_line(proc.stderr)
            assert "is full (No space left on device): free some space or choose another hydra.run.dir" in line
            assert sorted(p.name for p in mnt.iterdir()) == ["fill"]  # no snapshot, no empty folders left
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# ---------------------------------------------------------------- full disk


class FullDisk:
    """A file object that takes `room` bytes, then fails as a full disk does: a short write, then ENOSPC."""

    def __init__(self, real, room: int):
        self.real, self.room = real, room

    def write(self, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self.real.write(bytes(data[: self.room]))
        self.room -= n
        return n

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("room", [3000, 20000])
def test_injected_enospc_keeps_whole_lines_and_the_summary(tmp_path, monkeypatch, room):
    from hydra import compose, initialize_config_module

    import specpipe.config.schema  # noqa: F401
    from specpipe.events import EventWriter
    from specpipe.run import runner

    class FillingWriter(EventWriter):
        def __init__(self, path):
            super().__init__(path)
            self._file = FullDisk(self._file, room)

    monkeypatch.setattr(runner, "EventWriter", FillingWriter)
    with initialize_config_module(config_module="specpipe.conf", version_base=None):
        cfg = compose(config_name="config", overrides=[*TINY, "max_tokens=200"])
    result = runner.run(cfg, out_dir=tmp_path / "run")
    assert "No space left on device" in result.error and "whole lines of events.jsonl" in result.error
    data = (tmp_path / "run" / "events.jsonl").read_bytes()
    assert data.endswith(b"\n") and len(data) <= room  # cut back to the last whole line
    events = read_events(tmp_path / "run" / "events.jsonl")  # every line decodes
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and summary["error"].startswith("cannot write")
    emitted = [t for e in events if e.__class__.__name__ == "Emitted" for t in e.token_ids]
    assert summary["tokens"] == emitted  # the summary holds what the kept lines hold


def test_tiny_tmpfs_as_run_folder(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root): test_injected_enospc_* covers the same path")
    try:
        proc = run_cli([*TINY, "max_tokens=300", f"hydra.run.dir={mnt / 'run'}"], tmp_path)
        assert proc.returncode == 1
        line = proc.stderr.strip().splitlines()[-1]
        assert "No space left on device" in line and "kept" in line and "Traceback" not in proc.stderr
        events = read_events(mnt / "run" / "events.jsonl")
        summary = json.loads((mnt / "run" / "summary.json").read_text())
        assert summary["stop_reason"] == "error" and len(events) > 3
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_replay_skips_a_torn_last_line(tmp_path):
    proc = run_cli([*TINY, "max_tokens=8", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "r" / "events.jsonl"
    whole = read_events(path)
    path.write_bytes(path.read_bytes()[:-40])  # the last line cut mid-way, as a crash leaves it
    events, notice = read_recording(path)
    assert events == whole[:-1] and "torn last line" in notice
    from tui.sources import ReplaySource

    assert ReplaySource.from_file(path, speed=0).events == whole[:-1]
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:2] + [b"{garbage"] + lines[2:]))  # a bad line in the middle is not torn
    with pytest.raises(Exception):
        read_recording(path)


def _chat_in_a_terminal(args: list[str], cwd: Path, ready: str) -> tuple[int, str]:
    """`specpipe-chat *args` in a pseudo-terminal (as a user runs it): wait until `ready` is on the
    screen, quit with Ctrl+Q; return the exit code and everything it wrote."""
    import pty
    import select

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", *args],
        cwd=cwd,
        env=dict(ENV, TERM="xterm"),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        preexec_fn=default_stop_signals,
    )
    os.close(slave)
    seen, quit_at, deadline = b"", 0.0, time.time() + 120
    try:
        while proc.poll() is None and time.time() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    seen += os.read(master, 65536)
                except OSError:  # the terminal closed: the app exited
                    break
            if ready.encode() in seen and time.time() > quit_at + 2:
                os.write(master, b"\x11")  # Ctrl+Q (again if a key sent while the app set up was lost)
                quit_at = time.time()
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, seen.decode(errors="replace")


def test_replay_and_resume_of_a_torn_recording_through_the_cli(tmp_path):
    """The CLI read recordings strictly (exit 2) although the docs promise to skip a torn last line."""
    proc = run_cli([*TINY, "max_tokens=8", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "r" / "events.jsonl"
    path.write_bytes(path.read_bytes()[:-40])  # the last line cut mid-way, as a crash leaves it
    notice = f"specpipe-chat: skipped a torn last line in {path}"
    code, screen = _chat_in_a_terminal(["--replay", str(path), "--speed", "0"], tmp_path, "Quit")
    assert code == 0 and notice in screen and "cannot read" not in screen, screen[-2000:]
    code, screen = _chat_in_a_terminal(["--resume", str(path)], tmp_path, "Quit")
    assert code == 0 and notice in screen and "events recorded to" in screen, screen[-2000:]


# ---------------------------------------------------------------- stop signals and pipes


@pytest.mark.parametrize("sig, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP")])
def test_stop_signal_during_generation(tmp_path, sig, code, name):
    chars = random.Random(sig).randint(5, 60)  # a different point of the stream per signal, reproducibly
    proc = start(
        "specpipe.cli",
        [*ENDLESS, f"hydra.run.dir={tmp_path / 'r'}"],
        tmp_path,
    )
    out = ""
    while len(out) < chars:
        out += proc.stdout.read(1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-1].startswith("-- ")  # one summary line ends the run
    assert f"(interrupted by {name})" in lines[-1]
    summary = assert_kept(tmp_path / "r", "interrupted")
    assert summary["interrupted_by"] == name and len(summary["tokens"]) >= chars // 4


def test_ctrl_c_reaches_a_long_prefill(tmp_path):
    """A stop during prefill lands within a chunk (512 tokens), not after the whole prompt."""
    big = [
        "model=tiny-random",
        "+model.tiny.num_hidden_layers=3",
        "+model.tiny.hidden_size=1024",
        "+model.tiny.intermediate_size=4096",
        "+model.tiny.num_attention_heads=16",
        "+model.tiny.num_key_value_heads=4",
        "+model.tiny.head_dim=64",
        "draft=none",
        "prompt.chat=false",
        "max_tokens=4",
    ]
    prompt = "".join(random.Random(0).choice("abcdefgh ") for _ in range(4000))
    proc = start("specpipe.cli", [*big, f"prompt.text='{prompt}'", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path)
    header = proc.stderr.readline()  # printed when generation starts, right before the prefill
    assert header.startswith("specpipe: tiny-random"), header + proc.stderr.read()
    time.sleep(0.3)
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    stopped_after = time.time() - t0
    assert proc.returncode == 130, err
    events = read_events(tmp_path / "r" / "events.jsonl")
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["RunStarted", "RunFinished"], kinds  # the prefill never finished
    assert stopped_after < 60


@pytest.mark.parametrize("sig, code, name", [(signal.SIGINT, 130, "Ctrl-C (SIGINT)"), (signal.SIGTERM, 143, "SIGTERM")])
def test_stop_signal_while_starting_or_loading(tmp_path, sig, code, name):
    """Ctrl-C / SIGTERM before generation starts (imports, the override check, Hydra, the model load)."""
    # the override check composes every job of a sweep first (~0.1-0.3 s each here): a signal 2 s in lands there
    # (before the fix: a KeyboardInterrupt traceback and death by SIGINT); its last job is bad, so a signal that
    # came too late shows as an exit 2
    sweep = ["-m", "sampling.seed=0,-1", "budget.k=range(1,33)", f"hydra.sweep.dir={tmp_path / 'm'}"]
    proc = start("specpipe.cli", [*TINY, "max_tokens=2", *sweep], tmp_path, stdout=subprocess.DEVNULL)
    time.sleep(2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    line = error_line(err)
    assert line == f"specpipe: error: stopped by {name} before generation started; nothing was written"
    # and while the model loads: a tiny model of many wide layers takes seconds to build
    big = ["+model.tiny.num_hidden_layers=24", "+model.tiny.hidden_size=512", "+model.tiny.intermediate_size=2048"]
    folder = tmp_path / "r"
    proc = start(
        "specpipe.cli", [*TINY, *big, "draft=none", f"hydra.run.dir={folder}"], tmp_path, stdout=subprocess.DEVNULL
    )
    wait_for(lambda: (folder / ".hydra" / "overrides.yaml").exists() or proc.poll() is not None)  # Hydra's last step
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert error_line(err).startswith(f"specpipe: error: stopped by {name} before generation started")
    assert not folder.exists()  # nothing but Hydra's snapshot was there: removed


def test_a_signal_inside_the_override_check_is_a_stop_not_a_bad_configuration(monkeypatch):
    """A signal that lands inside OmegaConf can leave a half-built node whose next error OmegaConf wraps as a
    composition error with an empty message (CI: `bad configuration:  (in the sweep job ...)`, exit 2 instead of
    143). The check holds signals back per job and stops once that job's check ends."""
    from hydra.errors import ConfigCompositionException

    import specpipe.config.plugin_targets
    from specpipe.cli.argv import validate_overrides
    from specpipe.run import signals

    def check_targets_hit_by_a_signal(cfg):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:  # what OmegaConf did with the interrupt it was in the middle of
            raise ConfigCompositionException("") from None
        return None

    monkeypatch.setattr(specpipe.config.plugin_targets, "check_targets", check_targets_hit_by_a_signal)
    previous = {signum: signal.getsignal(signum) for signum in signals.STOP_SIGNALS}
    signals.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            validate_overrides(["-m", "model=tiny-random", "budget.k=1,2"])
        assert signals.received() == signal.SIGTERM
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signals.reset()


def test_broken_stdout_pipe_keeps_the_summary(tmp_path):
    proc = start(
        "specpipe.cli",
        [*ENDLESS, f"hydra.run.dir={tmp_path / 'r'}"],
        tmp_path,
    )
    proc.stdout.read(5)  # `specpipe ... | head -c 5`
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode == 141, err
    assert "Traceback" not in err and "(interrupted by a closed stdout pipe)" in err.strip().splitlines()[-1]
    assert_kept(tmp_path / "r", "interrupted")


def test_stdout_write_error_keeps_the_summary(tmp_path):
    """`specpipe ... > /dev/full`: ENOSPC on stdout (EIO alike) ends the run as a closed pipe does, exit 74."""
    with open("/dev/full", "w") as full:
        proc = start("specpipe.cli", [*TINY, "max_tokens=50", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path, stdout=full)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 74, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 2 and lines[0].startswith("specpipe: tiny-random"), err
    assert "(interrupted by a failed write to stdout (No space left on device))" in lines[1]
    summary = assert_kept(tmp_path / "r", "interrupted")
    assert summary["interrupted_by"] == "a failed write to stdout (No space left on device)"


def test_unstreamed_answer_into_a_closed_pipe(tmp_path):
    """`specpipe stream=false ... | true`: the answer is written after the last token, to a reader that left."""
    proc = start("specpipe.cli", [*TINY, "stream=false", "max_tokens=20", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path)
    proc.stdout.close()  # `| true`: the reader is gone before anything is written
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert proc.returncode == 141, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 2, err
    assert "(max_tokens, output cut by a closed stdout pipe)" in lines[1]
    summary = assert_kept(tmp_path / "r", "max_tokens")  # every token was generated and kept
    assert summary["interrupted_by"] == "a closed stdout pipe" and len(summary["tokens"]) == 20


@pytest.mark.parametrize("module", ["specpipe.bench.harness", "specpipe.cli.calibrate"])
def test_results_into_a_full_stdout(tmp_path, module):
    """`specpipe-bench ... > /dev/full`, `specpipe-calibrate ... > /dev/full`: one line saying where the result is."""
    tool, args, kept = {
        "specpipe.bench.harness": (
            "specpipe-bench",
            ["suite=code", "limit=1", "max_tokens=8", "anchor=false", "warmup=false"],
            tmp_path / "r" / "bench.jsonl",
        ),
        "specpipe.cli.calibrate": ("specpipe-calibrate", ["quick=true", "contexts=false"], tmp_path / "r"),
    }[module]
    env = dict(ENV, SPECPIPE_CACHE=str(tmp_path / "cache"))
    proc = run_into_full_stdout(
        [sys.executable, "-m", module, "model=tiny-random", *args, f"hydra.run.dir={tmp_path / 'r'}"], tmp_path, env
    )
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{tool}: error: cannot write to stdout (No space left on device): ") and str(kept) in line
    assert (kept if kept.suffix else kept / "calibration.json").stat().st_size > 0  # the result is kept


def run_into_full_stdout(argv: list[str], cwd, env) -> subprocess.CompletedProcess:
    """Run a command whose stdout is /dev/full (every write fails with ENOSPC); stderr captured."""
    with open("/dev/full", "w") as full:
        return subprocess.run(argv, cwd=cwd, env=env, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)


@pytest.mark.parametrize("flag", [["--cfg", "job"], ["--help"]])
def test_hydra_output_into_a_full_stdout(tmp_path, flag):
    """What Hydra prints itself (`specpipe --cfg job > /dev/full`) is one line and 74 too, not Hydra's traceback."""
    proc = run_into_full_stdout([sys.executable, "-m", "specpipe.cli", *flag], tmp_path, ENV)
    assert proc.returncode == 74
    assert "stopped by a failed write to stdout (No space left on device)" in error_line(proc.stderr)


def test_stop_signal_during_bench(tmp_path):
    args = [
        "model=tiny-random",
        "suite=code",
        "limit=6",
        "max_tokens=48",
        "anchor=false",
        "warmup=false",
        f"hydra.run.dir={tmp_path / 'b'}",
    ]
    proc = start("specpipe.bench.harness", args, tmp_path, stdout=subprocess.DEVNULL)
    first = proc.stderr.readline()
    while not first.startswith("[bench 1/"):
        assert first, proc.stderr.read()
        first = proc.stderr.readline()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    line = err.strip().splitlines()[-1]
    assert (
        line.startswith("specpipe-bench: error: stopped by SIGTERM: every finished prompt is in")
        and "Traceback" not in err
    )
    records = [json.loads(x) for x in (tmp_path / "b" / "bench.jsonl").read_text().splitlines()]
    assert 1 <= len(records) < 6  # whole lines only, every finished prompt kept


@pytest.fixture
def corpus(tmp_path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    rng = random.Random(0)
    for n in range(10):  # the trainer reads 20k characters per file: ~600 sequences of 32 tokens each
        (folder / f"m{n}.py").write_text(
            "\n".join(f"def f{i}(x):\n    return x * {i} + {rng.randint(0, 99)}" for i in range(800))
        )
    return folder


def test_stop_signal_during_training_checkpoints_and_resumes(tmp_path, corpus):
    head = tmp_path / "head"
    args = [
        "model=tiny-random",
        f"corpus={corpus}",
        f"out={head}",
        "sequences=16",
        "seq_len=32",
        "save_every=100000",
        f"hydra.run.dir={tmp_path / 't'}",
    ]
    proc = start("specpipe.train.drafter", [*args, "steps=100000"], tmp_path, stdout=subprocess.DEVNULL)
    line = proc.stderr.readline()
    while "target hidden states: 16/16" not in line:
        assert line, proc.stderr.read()
        line = proc.stderr.readline()
    time.sleep(random.Random(1).uniform(1.0, 2.0))  # somewhere in the training steps
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith(
        "specpipe-train-drafter: error: stopped by SIGTERM: checkpoint at step"
    )
    step = json.loads((head / "train_state" / "state.json").read_text())["step"]
    assert step >= 1 and f"step {step}/100000" in last
    again = run_cli(
        [*args, f"steps={step + 2}", "hydra.run.dir=" + str(tmp_path / "t2")], tmp_path, "specpipe.train.drafter"
    )
    assert again.returncode == 0, again.stderr
    assert f"resuming at step {step}" in again.stderr
    assert json.loads((head / "train_state" / "state.json").read_text())["step"] == step + 2


def test_ctrl_c_before_training_starts(tmp_path, corpus):
    args = [
        "model=tiny-random",
        f"corpus={corpus}",
        f"out={tmp_path / 'head'}",
        "sequences=4000",
        "seq_len=32",
        "chunk=4",
        f"hydra.run.dir={tmp_path / 't'}",
    ]
    proc = start("specpipe.train.drafter", args, tmp_path, stdout=subprocess.DEVNULL)
    line = proc.stderr.readline()
    while "target hidden states" not in line:  # inside the precompute
        assert line, proc.stderr.read()
        line = proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "specpipe-train-drafter: error: stopped by Ctrl-C (SIGINT) before training started; nothing was saved"
    )
    assert "Traceback" not in err
    assert not list((tmp_path / "head").rglob("*.safetensors"))  # no half-written corpus cache


def test_trainer_override_typo_is_one_line(tmp_path):
    proc = run_cli(["model=tiny-random", "stepz=3"], tmp_path, "specpipe.train.drafter")
    assert proc.returncode == 2
    assert "unknown config key 'stepz'" in error_line(proc.stderr, "specpipe-train-drafter")
    assert not (tmp_path / "outputs").exists()  # refused before Hydra made a run folder


# ---------------------------------------------------------------- models


def test_draft_and_target_vocab_sizes_differ(tmp_path):
    """Different logit widths (or tokenizers) draft through a token map now, token trees through the
    intersection map too; a tree through the text map (no candidates of its own per node) is refused in one line."""
    args = [*TINY, "+model.tiny.vocab_size=512", "draft=model", "draft.model=tiny-random", "sampling=sample"]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    proc = run_cli([*args, "max_tokens=8"], tmp_path / "a")
    assert proc.returncode == 0, proc.stderr
    assert "(vocab_map=intersection, 259 tokens shared)" in proc.stderr
    proc = run_cli([*args, "tree=dynamic", "max_tokens=8"], tmp_path / "b")
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "c").mkdir()
    proc = run_cli([*args, "tree=dynamic", "draft.vocab_map=text"], tmp_path / "c")
    assert proc.returncode == 1
    assert "use draft.vocab_map=intersection or tree=chain" in error_line(proc.stderr)


def test_prompt_longer_than_the_context(tmp_path):
    proc = run_cli(
        [
            "model=tiny-random",
            "+model.tiny.max_position_embeddings=64",
            "prompt.chat=false",
            "prompt.text=" + "ab" * 50,
        ],
        tmp_path,
    )
    assert proc.returncode == 1
    assert "the prompt is 100 tokens but tiny-random-llama's context is 64 tokens" in error_line(proc.stderr)


def test_corrupt_safetensors_folder(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "rms_norm_eps": 1e-5,
                "vocab_size": 259,
            }
        )
    )
    (folder / "model.safetensors").write_bytes(random.Random(0).randbytes(3000))
    proc = run_cli([f"model.path={folder}"], tmp_path)
    assert proc.returncode == 1
    assert "a weight file is corrupt or incomplete" in error_line(proc.stderr)


def test_gguf_cut_in_half(tmp_path, smollm2_gguf):
    half = tmp_path / "half.gguf"
    with open(smollm2_gguf, "rb") as src:
        half.write_bytes(src.read(os.path.getsize(smollm2_gguf) // 2))
    proc = run_cli([f"model.path={half}"], tmp_path)
    assert proc.returncode == 1
    assert re.search(r"is truncated: its tensors need \d+ bytes but the file has \d+ \(50%\)", error_line(proc.stderr))


def test_unsupported_packaged_model_is_refused_before_download(tmp_path, monkeypatch):
    from specpipe.engine.load import loader, model_store
    from specpipe.errors import ConfigError

    monkeypatch.setattr(model_store, "model_path", lambda *a, **k: pytest.fail("downloaded before refusing"))
    with pytest.raises(ConfigError, match="gemma3 architecture"):
        loader.load_engine("gemma3-270m")


def test_a_torn_calibration_cache_is_measured_again(tmp_path):
    """A torn calibration file made every budget=auto run fail with a traceback until deleted by hand."""
    cache = tmp_path / "cache"
    (cache / "calibration").mkdir(parents=True)
    args = ["model=tiny-random", "budget=auto", "max_tokens=4", "stream=false", "blas.threads=1", "hi"]  # one key
    first = run_module("specpipe.cli.generate", args, tmp_path, {**os.environ, "SPECPIPE_CACHE": str(cache)})
    assert first.returncode == 0, first.stderr
    (saved,) = (cache / "calibration").glob("*.json")
    saved.write_text(saved.read_text()[: len(saved.read_text()) // 2])  # torn mid-write, as a crash leaves it
    proc = run_module("specpipe.cli.generate", args, tmp_path, {**os.environ, "SPECPIPE_CACHE": str(cache)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    notices = [line for line in proc.stderr.splitlines() if "measuring it again" in line]
    assert len(notices) == 1 and "torn" in notices[0]
    assert json.loads(saved.read_text())["ratio"]["1"] == 1.0  # replaced by a whole file


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    "override, words",
    [
        ("+budget.kk=3", "unknown config key 'budget.kk'"),
        ("budget.k=40", "budget.k=40 is out of range"),
        ("draft.max_n=1000000000000", "draft.max_n=1000000000000 is out of range"),  # a table per n: was an OOM
        ("sampling.seed=-1", "sampling.seed=-1 is out of range"),
        (f"sampling.seed={2**64}", f"sampling.seed={2**64} is out of range"),
        ("sampling.temperature=nan", "sampling.temperature=nan is not a finite number"),
        ("prompt.text=a\udcffb", "has bytes that are not UTF-8"),
    ],
)
def test_bad_values_exit_2_before_anything_loads(tmp_path, override, words):
    from specpipe.cli.argv import validate_overrides

    assert words in validate_overrides(["model=tiny-random", override])
    if override.startswith("sampling.seed=-"):  # and end to end: exit 2, one line, no run folder
        proc = run_cli(["model=tiny-random", override], tmp_path)
        assert proc.returncode == 2 and words in error_line(proc.stderr)
        assert not (tmp_path / "outputs").exists()


def test_non_utf8_prompt_bytes_from_the_shell(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "specpipe.cli", "model=tiny-random", b"prompt.text=a\xffb"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "not UTF-8" in error_line(proc.stderr)


@functools.cache
def schema_keys() -> list[tuple[str, str, str, str]]:
    """(app, option override or "", dotted key, kind) for every int / float / str field of every option of
    every group, read from the typed schemas of the composed configs (a new option or key is fuzzed unasked).

    Model options other than tiny-random, presets and experiments name real models (a download): left out.
    """
    import dataclasses

    from hydra import compose, initialize_config_module
    from omegaconf import DictConfig, OmegaConf

    import specpipe.config.schema  # noqa: F401
    from specpipe.config.snapshot import packaged_defaults

    kinds = {"int": "int", "int | None": "int", "float": "float", "float | None": "float"}
    kinds |= {"str": "str", "str | None": "str"}
    found: dict[tuple[str, str, str], tuple[str, str, str, str]] = {}  # per app, key and schema

    def walk(app: str, choice: str, node: DictConfig, prefix: str) -> None:
        schema = OmegaConf.get_type(node)
        types = {f.name: str(f.type) for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else {}
        for key in map(str, node.keys()):
            if key.startswith("_") or key == "name":
                continue
            if isinstance(node[key], DictConfig):
                walk(app, choice, node[key], f"{prefix}{key}.")
            elif types.get(key) in kinds:
                row = (app, choice, f"{prefix}{key}", kinds[types[key]])
                found.setdefault((app, f"{prefix}{key}", getattr(schema, "__name__", "")), row)

    with initialize_config_module(config_module="specpipe.conf", version_base=None):
        for app in ("config", "bench"):
            base = ["model=tiny-random"]
            walk(app, "", compose(config_name=app, overrides=base), "")
            groups = [g for g, v in packaged_defaults(app).items() if isinstance(v, dict) and g != "model"]
            for group in groups:
                folder = ROOT / "specpipe" / "conf" / group
                for option in sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []:
                    try:
                        cfg = compose(config_name=app, overrides=[*base, f"{group}={option}"])
                    except Exception:  # noqa: BLE001  (an option that needs another, e.g. lookahead a tree)
                        continue
                    walk(app, f"{group}={option}", cfg[group], f"{group}.")
    return sorted(found.values())


SCHEMA_KEYS = st.deferred(lambda: st.sampled_from(schema_keys()))  # composed when the test runs, not at collection
ODD_VALUES = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, 0, 0.5, 1, 33, 65, 1e300, 2**64, -(2**63), 10**12]),
    st.integers(-3, 70),
    st.sampled_from(["", "null", "abc", "../x", "a b", "-1", "self", "llama", "cache"]),
    st.text(alphabet="abcxyz019_-.", max_size=8),
)
# keys whose value names a model or file: a random name could start a download, so they are only pre-checked
NO_RUN = ("model.name", "model.path", "draft.model", "draft.path", "draft.head", "draft.quant", "output_dir")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=SCHEMA_KEYS, value=ODD_VALUES)
@example(case=("config", "budget=auto", "budget.prior_alpha", "float"), value=-1)  # complex numbers once
@example(case=("config", "budget=auto", "budget.prior_alpha", "float"), value=1e300)  # a zero division once
@example(case=("config", "tree=dynamic", "tree.width", "int"), value=0)  # a reshape error once
def test_every_numeric_option_fails_cleanly_or_runs(case, value):
    """Any value of any numeric or string key of any option (from the schemas): one line from the pre-check,
    one line from the run, or a run. Runs only the specpipe app's keys on tiny-random, two tokens each."""
    from hydra import compose, initialize_config_module

    import specpipe.config.schema  # noqa: F401
    from specpipe.cli.argv import validate_overrides
    from specpipe.errors import SpecpipeError
    from specpipe.run.session import Session

    app, choice, key, kind = case
    if kind == "int" and isinstance(value, float) and math.isfinite(value) and abs(value) < 2**70:
        value = int(value)  # mostly numbers of the key's own type; the rest test the type check
    text = f"'{value}'" if isinstance(value, str) else str(value)
    overrides = ["model=tiny-random", "prompt.text=ab ab", *([choice] if choice else []), f"{key}={text}"]
    if choice.startswith("tree=") and choice != "tree=chain":
        overrides += ["draft=model", "draft.model=self"]  # trees need a drafter with probabilities or n-gram lookups
    message = validate_overrides(overrides, config_name=app, app=app)
    if message:
        assert "\n" not in message and "Traceback" not in message
        return
    if app != "config" or key in NO_RUN:
        return
    with initialize_config_module(config_module="specpipe.conf", version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    try:
        session = Session(cfg)
        events = list(session.generate(session.encode(), max_tokens=2))
    except SpecpipeError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(events[-1], RunFinished) and events[-1].stop_reason in ("max_tokens", "eos")


# ---------------------------------------------------------------- the table in docs/faults.md


def test_the_fault_table_names_a_test_for_every_row():
    """Each row of docs/faults.md names a test of this module (or of a test_faults_*.py beside it) that exists;
    each fault test has a row."""
    import ast

    table = (ROOT / "docs" / "faults.md").read_text().split("## Faults", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("|") and not set(line) <= set("|- ")]
    named = [re.findall(r"`(test_\w+)`", row) for row in rows[1:]]  # rows[0] is the header
    assert named and all(named), "every row of the fault table names its test"
    modules = [Path(__file__), *sorted(Path(__file__).parent.glob("test_faults_*.py"))]
    tree = [n for m in modules for n in ast.parse(m.read_text()).body]
    tests = {n.name for n in tree if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    listed = {t for ts in named for t in ts}
    assert listed <= tests, f"the table names tests that do not exist: {sorted(listed - tests)}"
    assert tests - listed == {"test_the_fault_table_names_a_test_for_every_row"}, f"no row for {sorted(tests - listed)}"
