"""`specpipe-tune` end to end on a tiny random model: verdicts first, a preset in the user's config folder
that `specpipe preset=<name>` then runs with, a rerun that skips every finished measurement, and bad
input as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources

import pytest

ARGS = ["model=tiny-random", "suites=[]", "prompts.file=mine.txt", "prompts.kind=edits", "limit=2", "max_tokens=6"]
ARGS += ["drafts=[ngram]"]  # one candidate: the tune's routine, not every default drafter
ARGS += ["ks=[4]", "widen_to=[8]", "widen_at=0.0", "save_as=roundtrip"]  # widen_at=0: the widening path runs too


def run(module: str, args: list[str], folder, config_dir) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CONFIG_HOME=str(config_dir))
    env.pop("SPECPIPE_CONFIG_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tune")
    (folder / "mine.txt").write_text(
        "Rename x to y in: def f(x): return x + 1\n---\nAdd type hints: def g(a, b): return a * b\n"
    )
    config_dir = folder / "config"
    first = run("specpipe.tune.cli", ARGS, folder, config_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    return folder, config_dir, first


def test_verdicts_come_first_then_the_table_then_the_preset(tuned):
    folder, config_dir, first = tuned
    lines = first.stdout.splitlines()
    assert lines[0].startswith("edits: "), first.stdout  # one verdict per task kind, before anything else
    assert "draft=ngram" in lines[0]
    assert any(line.startswith("| edits | draft=ngram | auto | 2 |") for line in lines), first.stdout
    assert any(line.startswith("| edits | draft=ngram | K=8 | 2 |") for line in lines), first.stdout  # widened
    assert "**NO**" not in first.stdout  # every option's output equalled plain decoding's
    preset = config_dir / "specpipe" / "preset" / "roundtrip.yaml"
    text = preset.read_text()
    assert "# @package _global_" in text and "override /draft: ngram" in text and "_target_" not in text
    assert not resources.files("specpipe.conf").joinpath("preset", "roundtrip.yaml").is_file()  # never in the package


def test_the_preset_runs_in_specpipe_and_composes_in_the_server(tuned):
    folder, config_dir, _ = tuned
    proc = run("specpipe.cli.generate", ["preset=roundtrip", "max_tokens=3", "hello"], folder, config_dir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (summary,) = sorted(folder.glob("outputs/*-*-*/*/summary.json"))[-1:]
    config = (summary.parent / ".hydra" / "config.yaml").read_text()
    assert "name: tiny-random" in config and "name: ngram" in config, config
    chosen = json.loads(summary.read_text())
    assert chosen["stats"]["generated_tokens"] == 3
    served = run("specpipe.serve.cli", ["preset=roundtrip", "--cfg", "job"], folder, config_dir)
    assert served.returncode == 0 and "name: tiny-random" in served.stdout, served.stderr[-2000:]


def test_a_rerun_skips_every_finished_measurement(tuned):
    folder, config_dir, first = tuned
    results = folder / "outputs" / "tune" / "roundtrip.jsonl"
    before = results.read_text()
    again = run("specpipe.tune.cli", ARGS, folder, config_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert results.read_text() == before  # nothing measured twice
    assert again.stderr.count("[bench] resume: 2 of 2 prompts already in") == 2, again.stderr  # auto+K=4, then K=8
    assert again.stdout.splitlines()[0] == first.stdout.splitlines()[0]


def test_editing_one_prompt_measures_that_prompt_again_only(tuned):
    """Finished measurements are keyed by a hash of the prompt's text (and the config), not its id: the edited
    second prompt keeps its id (edits-2) and is measured again; the first is not. Runs after the rerun test."""
    folder, config_dir, _ = tuned
    results = folder / "outputs" / "tune" / "roundtrip.jsonl"
    before = results.read_text().splitlines()
    mine = folder / "mine.txt"
    original = mine.read_text()
    mine.write_text(original.replace("def g(a, b): return a * b", "def g(a, b, c): return a * b * c"))
    try:
        again = run("specpipe.tune.cli", ARGS, folder, config_dir)
    finally:
        mine.write_text(original)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("[bench] resume: 1 of 2 prompts already in") == 2, again.stderr  # auto+K=4, then K=8
    added = [json.loads(line) for line in results.read_text().splitlines()[len(before) :]]
    assert [r["prompt_id"] for r in added] == ["edits-2", "edits-2"]


def test_an_unknown_drafter_is_one_line(tmp_path):
    proc = run("specpipe.tune.cli", ["model=tiny-random", "drafts=[ngramm]"], tmp_path, tmp_path / "config")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "choose from" in proc.stderr, proc.stderr


def test_sessions_measure_each_fixed_k_as_a_run_of_its_own(tmp_path):
    """suites=[sessions] with draft=suffix (both among tune's choices): history goes from request to request, so
    a fixed K is not measured beside auto in one run (the bench refuses that) but as a run of its own."""
    import io

    from hydra import compose, initialize_config_module

    import specpipe.config.schema  # noqa: F401  (schemas, resolvers)
    from specpipe.tune.cli import Progress
    from specpipe.tune.plan import parse_candidate, task_kinds
    from specpipe.tune.routine import measure_all

    overrides = ["model=tiny-random", "suites=[sessions]", "limit=4", "max_tokens=6", "ks=[4]", "widen_to=[]"]
    with initialize_config_module("specpipe.conf", version_base=None):
        cfg = compose("tune", [*overrides, "warmup=false"])
    assert "suffix" in cfg.drafts  # a default candidate
    progress = Progress(8, stream=io.StringIO())
    [outcome] = measure_all(cfg, [parse_candidate("suffix")], task_kinds(cfg, tmp_path), tmp_path / "r.jsonl", progress)
    assert outcome.skipped is None, outcome.skipped
    assert sorted(outcome.options) == ["K=4", "auto"]
    assert [len(runs) for runs in outcome.options.values()] == [4, 4]
    assert all(run["lossless"] for runs in outcome.options.values() for run in runs)


def test_calibrate_composes_the_run_specpipe_composes():
    """calibrate.yaml repeats config.yaml's defaults (only a primary config may set the search path)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    import specpipe.config.schema  # noqa: F401  (schemas, resolvers)

    overrides = ["model=tiny-random", "draft=model", "preset=quick"]
    with initialize_config_module("specpipe.conf", version_base=None):
        run = OmegaConf.to_container(compose("config", overrides))
        calibrate = OmegaConf.to_container(compose("calibrate", overrides))
    assert calibrate.pop("quick") is False and calibrate.pop("contexts") is True
    assert calibrate.pop("check") is True and calibrate.pop("check_tokens") == 48  # calibrate's measured check
    # the chat keeps a prefix store; calibrate times forwards and keeps none (docs/prefix_cache.md)
    store, kept = calibrate.pop("prefix_cache"), run.pop("prefix_cache")
    assert store == {**kept, "enabled": False} and kept["enabled"] is True
    assert calibrate == run


def test_a_terminal_gets_a_bar_with_an_eta_that_counts_measured_and_resumed_prompts():
    import fcntl
    import pty
    import struct
    import termios

    from specpipe.tune.cli import Progress

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with open(slave, "w") as terminal:
        progress = Progress(4, stream=terminal)
        assert progress.bar is not None  # a terminal: a bar, not lines
        progress.plan("code: draft=ngram", None)
        progress.line("[bench] smollm2-135m (float32), 3 prompts")  # not a measured prompt
        progress.line("[bench 1/1] code/code-rename ngram auto: ... | ETA 0s")
        progress.settle(3)  # the run's records: 1 measured now, 2 resumed from the results file
        assert progress.bar.n == 3
        progress.bar.refresh()
        progress.close()
    chunks = []
    while True:  # a pty hands its output over in pieces: read to the end (EIO once the slave side is closed)
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    drawn = b"".join(chunks).decode(errors="replace")
    os.close(master)
    assert "3/4" in drawn and "prompt/s" in drawn and "<" in drawn, drawn  # n/total, rate, elapsed<remaining


# ~20 s: six prompts to stop in the middle of; the rerun test above covers resume in the default run
@pytest.mark.statistical
def test_a_stopped_tune_keeps_its_measurements_and_the_same_command_resumes(tmp_path):
    import signal

    args = ["model=tiny-random", "suites=[code]", "limit=6", "max_tokens=24", "ks=[4]", "widen_to=[]", "save_as=stop"]
    args += ["drafts=[ngram]"]
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "specpipe.tune.cli", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stderr.readline()
    while "[bench 1/" not in line:
        assert line, proc.stderr.read()
        line = proc.stderr.readline()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("specpipe-tune: error: stopped by SIGTERM: every finished measurement is in"), err
    assert "run the same command again to resume" in last and "Traceback" not in err
    kept = (tmp_path / "outputs" / "tune" / "stop.jsonl").read_text().splitlines()
    assert 1 <= len(kept) < 6
    again = run("specpipe.tune.cli", args, tmp_path, tmp_path / "config")
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"[bench] resume: {len(kept)} of 6 prompts already in" in again.stderr, again.stderr
    assert len((tmp_path / "outputs" / "tune" / "stop.jsonl").read_text().splitlines()) == 6


def test_spec_bench_questions_get_a_verdict_per_task(tmp_path):
    """prompts.format=spec-bench reads Spec-Bench's question.jsonl through the bench's reader (first turns,
    MT-Bench's categories as one task) and the verdicts come one per task."""
    rows = [
        {"question_id": 81 + i, "category": cat, "turns": [f"{cat}: say a b a b a b", "second turn"]}
        for i, cat in enumerate(["writing", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"])
    ]
    (tmp_path / "question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["model=tiny-random", "suites=[]", "prompts.file=question.jsonl", "prompts.format=spec-bench"]
    args += ["drafts=[ngram]", "prompts.per_category=1", "max_tokens=4", "ks=[4]", "widen_to=[]", "save_as=specbench"]
    proc = run("specpipe.tune.cli", args, tmp_path, tmp_path / "config")
    assert proc.returncode == 0, proc.stderr[-2000:]
    tasks = [line.split(":", 1)[0] for line in proc.stdout.split("\n\n", 1)[0].splitlines()]
    assert tasks == ["math_reasoning", "mt_bench", "qa", "rag", "summarization", "translation"], proc.stdout
    # writing, coding: one task, one question drawn, and its second turn after the first answer
    assert "| mt_bench | draft=ngram | auto | 2 |" in proc.stdout
    # Spec-Bench answer files for its own speed() / equal.py: plain decoding's beside the measurement's, one line
    # per question (MT-Bench's two turns in one), under the file's own categories
    files = sorted((tmp_path / "outputs" / "tune" / "spec_bench").glob("*.jsonl"))
    plain = [f for f in files if "-plain-" in f.name]
    assert plain and len(files) > len(plain), files
    lines = [json.loads(line) for line in plain[0].read_text().splitlines()]
    assert {line["category"] for line in lines} <= {r["category"] for r in rows} and len(lines) == 6
    assert any(len(line["choices"][0]["turns"]) == 2 for line in lines)
