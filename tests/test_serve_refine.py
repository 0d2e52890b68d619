"""A server refines budget=auto's cost model while idle (issue 33: no measurement on a request's path): real
servers on 127.0.0.1 (a tiny random model, 4 layers so a long-context timing lasts long enough to interrupt),
each with a fresh calibration cache, one request at a time and batched. After a request past 1k positions
the idle server times the verify curves at 1024 and 4032 cached positions (serve/idle.py, costmodel/refine.py)
and logs what it timed in requests.jsonl; a request sent while it times 4032 stops it after the forward in
flight: its queue time stays small, its answer equals draft=none's, and the refinement resumes once the server
is idle again. A fixed-K server never refines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specpipe.engine.load.loader import load_engine
from tests.test_serve_events import alone, stream_completion, streamed_tokens
from tests.test_server import Server

LAYERS = 4  # the tiny model's default 2 layers time 4032 positions in ~0.2 s; 4 give a window to land in
LONG = " ".join(f"w{i % 50}" for i in range(300))  # ~1.2k byte tokens: its context wants the 1024 and 4032 curves
SHORT = "one two three one two three one two three"
MAX_WAIT_S = 0.5  # a request's queue time while the server refines: one forward, far below the 4032 timing's


@pytest.fixture(scope="module")
def target():
    return load_engine("tiny-random", precision="float32", arch="llama", seed=0, tiny={"num_hidden_layers": LAYERS})


class CachedServer(Server):
    """test_server's Server with its own calibration cache (SPECPIPE_CACHE); start-up lines before the one
    naming the port are skipped (a batched auto server first says what T(B, n) it timed)."""

    def __init__(self, cwd: Path, cache: Path, *overrides: str):
        args = ["port=0", "max_tokens=24", "model=tiny-random", f"+model.tiny.num_hidden_layers={LAYERS}"]
        with pytest.MonkeyPatch.context() as env:
            env.setenv("SPECPIPE_CACHE", str(cache))
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "specpipe.serve.cli", *args, *overrides],
                cwd=cwd,
                stderr=subprocess.PIPE,
                text=True,
            )
        assert self.proc.stderr is not None
        seen = ""
        while not (match := re.search(r"http://127\.0\.0\.1:(\d+)/v1", line := self.proc.stderr.readline())):
            seen += line
            assert line, seen + self.proc.stderr.read()  # it exited before listening
        self.base = f"http://127.0.0.1:{match.group(1)}"
        self.log = Path(line.rsplit("requests -> ", 1)[1].strip())


def start(tmp_path: Path, *overrides: str) -> tuple[Server, Path]:
    """A tiny-random server with its own empty calibration cache, and that cache's calibration folder."""
    server = CachedServer(tmp_path, tmp_path / "cache", *overrides)
    return server, tmp_path / "cache" / "calibration"


def timed_lengths(calibration: Path) -> set[int]:
    """The cache lengths whose long-context curves the server cached (context_curve.py's file)."""
    files = list(calibration.glob("*-ctx-*.json"))
    return {int(c) for f in files for c in json.loads(f.read_text())} if files else set()


def refine_records(server: Server) -> list[dict]:
    lines = server.log.read_text().splitlines() if server.log.exists() else []
    return [r["refine"] for r in map(json.loads, lines) if "refine" in r]


def wait_for(condition, what: str, limit_s: float = 20.0, every_s: float = 0.002):
    deadline = time.monotonic() + limit_s
    while not (found := condition()):
        assert time.monotonic() < deadline, f"no {what} within {limit_s} s"
        time.sleep(every_s)
    return found


@pytest.mark.parametrize("batch", ["max_batch=1", "max_batch=2"], ids=["one-at-a-time", "batched"])
def test_an_idle_auto_server_refines_and_a_request_waits_one_forward(tmp_path, target, batch):
    server, calibration = start(tmp_path, "draft=ngram", "budget=auto", batch)
    try:
        stream_completion(server, LONG, 4)
        assert timed_lengths(calibration) == set()  # nothing timed on the request's path
        wait_for(lambda: 1024 in timed_lengths(calibration), "1024 curve")  # idle: the refinement began
        chunks, last = stream_completion(server, SHORT, 24)  # sent while it times 4032
        assert [t["id"] for t in streamed_tokens(chunks)] == alone(target, SHORT, 24)
        queue_s = last["specpipe"]["queue_s"]
        done = wait_for(lambda: [r for r in refine_records(server) if not r["stopped"]], "finished refinement")
    finally:
        server.proc.kill()
        server.proc.wait(timeout=30)
    spells = refine_records(server)
    stopped = spells[0]
    # the request stopped the refinement inside 4032's timing, which the next idle spell resumed and finished
    assert stopped["stopped"] and stopped["timing"] == 4032, spells
    assert [t["context"] for t in stopped["timed"]] == [1024] and stopped["timed"][0]["t1_s"] > 0
    assert done[-1]["resumed"] == 4032 and [t["context"] for t in done[-1]["timed"]] == [4032] and done[-1]["units"]
    assert timed_lengths(calibration) == {1024, 4032}
    # one forward's wait, not the rest of the timing (the resumed spell's seconds)
    assert queue_s < MAX_WAIT_S and queue_s < done[-1]["seconds"] / 2, (queue_s, spells)


def test_a_fixed_k_server_never_refines(tmp_path, target):
    server, calibration = start(tmp_path, "draft=ngram", "budget=fixed", "budget.k=4")
    try:
        stream_completion(server, LONG, 4)
        time.sleep(1.0)  # five idle polls of the worker: an auto server would have timed 1024 by now
        chunks, _ = stream_completion(server, SHORT, 24)
        assert [t["id"] for t in streamed_tokens(chunks)] == alone(target, SHORT, 24)
    finally:
        server.proc.kill()
        server.proc.wait(timeout=30)
    assert timed_lengths(calibration) == set() and refine_records(server) == []


def test_a_failed_timing_is_logged_once_and_ends_the_refinement(tmp_path, monkeypatch):
    """A timing that raises (memory for a long cache) must not take the decoding thread down with it."""
    from specpipe.costmodel.context_curve import ContextCurve
    from specpipe.serve.idle import IdleRefinement
    from tests.conftest import tiny

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))
    engine = tiny()
    curve = ContextCurve(engine)
    curve.longest = 600  # a request came near 1k positions: the 1024 curve is wanted

    def no_room():
        raise MemoryError("no room for 1024 positions")

    monkeypatch.setattr(engine, "make_cache", no_room)
    records: list[dict] = []
    idle = IdleRefinement(engine, records.append, curve)
    idle.run(lambda: False)
    assert records == [{"refine": {"timed": [], "error": "MemoryError: no room for 1024 positions"}}]
    assert idle.failed and curve.refining is None
    idle.run(lambda: False)
    assert len(records) == 1  # not tried again
