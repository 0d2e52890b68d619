"""The `specpipe` command end to end: run folder contents, one-line errors,
Ctrl-C. Runs the real console script in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specpipe.events import RunFinished, read_events

TINY = ["model=tiny-random", "max_tokens=24", "prompt.text=ab ab ab ab"]


def specpipe(args, cwd, **kw):
    return subprocess.run(
        [sys.executable, "-m", "specpipe.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300, **kw
    )


def run_dir(cwd: Path) -> Path:
    (summary,) = list(cwd.glob("outputs/*/*/summary.json"))
    return summary.parent


def test_tiny_run_writes_snapshot(tmp_path):
    proc = specpipe(TINY + ["budget.k=4"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = run_dir(tmp_path)
    assert (folder / ".hydra" / "config.yaml").exists()
    summary = json.loads((folder / "summary.json").read_text())
    stats = summary["stats"]
    for key in ("target_forwards", "draft_forwards", "drafted", "accepted", "acceptance_rate", "tokens_per_forward",
                "prefill_tok_s", "decode_tok_s", "ttft_s", "latency_ms", "peak_memory_bytes"):
        assert key in stats
    assert set(stats["latency_ms"]) == {"p50", "p95", "p99"}
    assert summary["stop_reason"] == "max_tokens" and len(summary["tokens"]) == 24
    assert summary["versions"]["mlx"] and summary["target"]["sha256"] and summary["device"]["mlx_device"]
    events = read_events(folder / "events.jsonl")
    assert isinstance(events[-1], RunFinished) and events[-1].token_ids == summary["tokens"]
    assert "acceptance" in proc.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    "args, words",
    [
        (["draft=bogus"], "unknown option draft=bogus"),
        (["budget.k=33"], "budget.k=33 is out of range"),
        (["budget.k=0"], "out of range"),
        (["nope=1"], "unknown config key"),
        (["sampling.temperature=-1"], "negative"),
        (["sampling.top_p=1.5"], "top_p"),
        (["model.path=/does/not/exist.gguf"], "does not exist"),
        (["model=nosuchmodel"], "unknown option model=nosuchmodel"),
        (["model.name=nosuchmodel"], "unknown model 'nosuchmodel'"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, words):
    proc = specpipe(["model=tiny-random", *args], tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_lists_the_option_groups_without_schemas(tmp_path):
    proc = specpipe(["--help"], tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("specpipe:") and "schema/" not in proc.stdout
    assert "budget: adaptive, auto, confidence, fixed" in proc.stdout and "suite:" not in proc.stdout  # bench-only


def test_not_a_gguf_file(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"this is not a gguf file at all" * 10)
    proc = specpipe([f"model.path={bogus}"], tmp_path)
    assert proc.returncode != 0
    assert len(proc.stderr.strip().splitlines()) == 1 and "GGUF" in proc.stderr, proc.stderr


def test_mismatched_tokenizers(tmp_path, smollm2_gguf):
    proc = specpipe(["model=tiny-random", "draft=model", "draft.model=smollm2-135m"], tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "different tokenizers" in lines[0], proc.stderr


def test_ctrl_c_keeps_what_was_generated(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specpipe.cli", "model=tiny-random", "+model.tiny.num_hidden_layers=8", "+model.tiny.hidden_size=256", "+model.tiny.intermediate_size=1024",
         "draft=none", "max_tokens=100000", "prompt.text=hi"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        # a runner started in the background may ignore SIGINT; the child must not inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    out = ""
    deadline = time.time() + 120
    while len(out) < 20 and time.time() < deadline:  # wait until text streams
        out += proc.stdout.read(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    summary = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted"
    assert len(summary["tokens"]) >= 20
