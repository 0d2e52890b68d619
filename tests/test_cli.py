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
    for key in (
        "target_forwards",
        "draft_forwards",
        "drafted",
        "accepted",
        "acceptance_rate",
        "tokens_per_forward",
        "prefill_tok_s",
        "decode_tok_s",
        "ttft_s",
        "latency_ms",
        "peak_memory_bytes",
    ):
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


def test_help_lists_the_users_own_presets_beside_the_packaged_ones(tmp_path):
    """`specpipe --help` (and the bench's, which shares the help template) names the presets specpipe-tune
    wrote, as the user's, with their folder; one with a packaged preset's name is said to be hidden by it."""
    folder = tmp_path / "config" / "preset"
    folder.mkdir(parents=True)
    for name in ("tuned", "quick"):
        (folder / f"{name}.yaml").write_text("# @package _global_\nmax_tokens: 7\n")
    (folder / "half.yaml.tmp").write_text("")  # a preset being written: not an option
    env = {**os.environ, "SPECPIPE_CONFIG_DIR": str(tmp_path / "config")}
    mine = f"preset (yours, in {folder}): quick (hidden by the packaged quick: rename it), tuned"
    for module in ("specpipe.cli", "specpipe.bench.harness"):
        proc = subprocess.run(
            [sys.executable, "-m", module, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[lines.index("preset: quick, real-pair") + 1] == mine, proc.stdout
    env["SPECPIPE_CONFIG_DIR"] = str(tmp_path / "none")  # a user who never tuned: no line of theirs
    proc = subprocess.run(
        [sys.executable, "-m", "specpipe.cli", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "(yours" not in proc.stdout


def test_not_a_gguf_file(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"this is not a gguf file at all" * 10)
    proc = specpipe([f"model.path={bogus}"], tmp_path)
    assert proc.returncode != 0
    assert len(proc.stderr.strip().splitlines()) == 1 and "GGUF" in proc.stderr, proc.stderr


def test_mismatched_tokenizers_draft_through_a_token_map(tmp_path, smollm2_gguf):
    """SmolLM2 (BPE) drafts for the tiny byte model: draft.vocab_map=auto picks the intersection, the header,
    summary.json and the chat's panel (fed the run's own events) say so, and the tokens are plain decoding's."""
    from tui.figures import Figures

    args = ["model=tiny-random", "max_tokens=12", "prompt.text=ab ab ab ab"]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    proc = specpipe([*args, "draft=model", "draft.model=smollm2-135m"], tmp_path / "a")
    assert proc.returncode == 0, proc.stderr
    assert "(vocab_map=intersection, 238 tokens shared)" in proc.stderr.splitlines()[0], proc.stderr
    summary = json.loads((run_dir(tmp_path / "a") / "summary.json").read_text())
    assert (summary["draft_vocab_map"], summary["draft_vocab_shared"]) == ("intersection", 238)
    figures = Figures()
    figures.consume(next(iter(read_events(run_dir(tmp_path / "a") / "events.jsonl"))))
    assert ("vocab map", "intersection (238 shared)") in figures.rows()
    assert specpipe([*args, "draft=none"], tmp_path / "b").returncode == 0
    assert summary["tokens"] == json.loads((run_dir(tmp_path / "b") / "summary.json").read_text())["tokens"]


@pytest.mark.parametrize("vocab", [64, 0])
def test_a_cut_draft_head_is_said_in_the_header_the_events_and_the_summary(tmp_path, vocab):
    proc = specpipe(TINY + ["draft=model", "draft.model=tiny-random", f"draft.vocab={vocab}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = run_dir(tmp_path)
    rows = json.loads((folder / "summary.json").read_text())["draft_head_rows"]
    started = next(iter(read_events(folder / "events.jsonl")))
    assert started.draft_head_rows == rows
    if vocab:
        assert 64 <= rows < 80  # the 64 asked for plus the end ids
        assert f"head cut to {rows} rows" in proc.stderr.splitlines()[0]
    else:
        assert rows is None and "head cut" not in proc.stderr


def test_ctrl_c_keeps_what_was_generated(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specpipe.cli",
            "model=tiny-random",
            "+model.tiny.num_hidden_layers=8",
            "+model.tiny.hidden_size=256",
            "+model.tiny.intermediate_size=1024",
            "draft=none",
            "max_tokens=100000",
            "+model.tiny.max_position_embeddings=1000000",  # room for an endless answer: the test stops it
            "prompt.text=hi",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
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


# ---------------------------------------------------------------- prompts, re-runs, Hydra's own flags

TRICKY = "Rename x to y in: def f(x): return x + 1  # it's (a, b) ${not.a.key} \\ end\\"


def _run_config(folder: Path) -> tuple[str, list[int]]:
    from omegaconf import OmegaConf

    text = OmegaConf.load(folder / ".hydra" / "config.yaml").prompt.text
    return text, json.loads((folder / "summary.json").read_text())["tokens"]


@pytest.mark.parametrize("form", ["positional", "--prompt", "--prompt=", "prompt.file", "stdin", "unquoted"])
def test_prompt_forms_keep_the_text_literally(tmp_path, form):
    (tmp_path / "task.txt").write_text(TRICKY, encoding="utf-8")
    args, stdin = {
        "positional": ([TRICKY], None),
        "--prompt": (["--prompt", TRICKY], None),
        "--prompt=": ([f"--prompt={TRICKY}"], None),
        "prompt.file": (["prompt.file=task.txt"], None),
        "stdin": (["-"], TRICKY),
        "unquoted": ([f"prompt.text={TRICKY}"], None),
    }[form]
    proc = specpipe(["model=tiny-random", "max_tokens=3", *args], tmp_path, input=stdin)
    assert proc.returncode == 0, proc.stderr
    text, _ = _run_config(run_dir(tmp_path))
    assert text == TRICKY  # the snapshot holds the text itself, so a re-run needs no file
    (started,) = [e for e in read_events(run_dir(tmp_path) / "events.jsonl") if type(e).__name__ == "RunStarted"]
    assert started.prompt_text == TRICKY


@pytest.mark.parametrize(
    "args, words",
    [
        (["prompt.file=missing.txt"], "prompt file missing.txt does not exist"),
        (["--prompt"], "--prompt needs a value"),
        (["one", "--prompt", "two"], "two prompts given"),
        (["-m", "--cfg", "job"], "cannot be combined"),
    ],
)
def test_bad_prompt_input_is_one_line(tmp_path, args, words):
    proc = specpipe(["model=tiny-random", *args], tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr


def test_a_prompt_file_that_is_not_utf8_is_one_line(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9")
    proc = specpipe(["model=tiny-random", "prompt.file=bad.txt"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not UTF-8" in proc.stderr, proc.stderr


def test_rerun_of_a_snapshot_reproduces_its_tokens(tmp_path):
    first = specpipe(["model=tiny-random", "max_tokens=12", "sampling=sample", "sampling.seed=7", TRICKY], tmp_path)
    assert first.returncode == 0, first.stderr
    import shutil

    original = tmp_path / "kept-run"
    shutil.copytree(run_dir(tmp_path), original)
    text, tokens = _run_config(original)
    for how in (["--rerun", str(original)], ["--config-dir", str(original / ".hydra"), "--config-name", "config"]):
        for s in tmp_path.glob("outputs/*/*/summary.json"):  # keep run_dir() unambiguous
            s.parent.rename(tmp_path / f"done-{s.parent.name}-{len(list(tmp_path.glob('done-*')))}")
        again = specpipe(how, tmp_path)
        assert again.returncode == 0, again.stderr
        assert _run_config(run_dir(tmp_path)) == (text, tokens), how


def test_rerun_of_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    proc = specpipe(["--rerun", str(tmp_path)], tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is not a run folder" in proc.stderr


def test_tab_completion_installs_and_answers(tmp_path):
    # What `eval "$(specpipe --shell-completion install=bash)"` then Tab does, in a real bash.
    bin_dir = Path(sys.executable).parent
    script = (
        'eval "$(specpipe --shell-completion install=bash)"; COMP_LINE="specpipe budget="; COMP_POINT=${#COMP_LINE}; '
        'COMP_WORDS=(specpipe budget=); COMP_CWORD=1; hydra_bash_completion; echo "${COMPREPLY[@]}"'
    )
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {"budget=auto", "budget=fixed", "budget=adaptive"} <= set(proc.stdout.split()), proc.stdout + proc.stderr
    assert "unknown config key" not in proc.stderr


@pytest.mark.parametrize(
    "flags", [["--info"], ["--cfg", "job"], ["-cn", "config", "--cfg", "job"], ["preset=quick", "--cfg", "job"]]
)
def test_hydra_flags_work(tmp_path, flags):
    proc = specpipe(flags, tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.strip()


@pytest.mark.parametrize("args, code", [(["budget=auto", "budget.k=16"], 2), (["model.path=/does/not/exist.gguf"], 1)])
def test_a_run_that_fails_before_generating_leaves_no_run_folder(tmp_path, args, code):
    proc = specpipe(["model=tiny-random", *args], tmp_path)
    assert proc.returncode == code, proc.stderr
    assert list(tmp_path.glob("outputs/*/*")) == []


SHELLS = {  # every console script that composes a Hydra config goes through specpipe/cli/shell.py
    "specpipe": "specpipe.cli",
    "specpipe-bench": "specpipe.bench.harness",
    "specpipe-calibrate": "specpipe.cli.calibrate",
    "specpipe-train-drafter": "specpipe.train.drafter",
    "specpipe-serve": "specpipe.serve.cli",
    "specpipe-chat": "tui.cli",
}


@pytest.mark.parametrize("tool", sorted(SHELLS))
def test_every_command_has_the_same_shell(tool, tmp_path):
    """A misspelled key is one line and exit 2 in every command, before anything loads (the trainer used to
    skip the check), and no run folder is left behind."""
    proc = subprocess.run(
        [sys.executable, "-m", SHELLS[tool], "model=tiny-random", "+budget.kk=3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: ") and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "outputs").exists()


def test_the_summary_says_what_speculation_was_worth_against_plain(tmp_path):
    """The estimate is priced from a calibration the run already has: none cached and a fixed K, nothing is
    timed for it (the run's own plain steps, where the n-gram found nothing, price it); budget=auto
    calibrates, and then a fixed-K run reads that cache."""
    # one BLAS thread count for every run: the calibration's key has it, and a busy machine lowers the default
    env = {**os.environ, "SPECPIPE_CACHE": str(tmp_path / "cache"), "OPENBLAS_NUM_THREADS": "1"}

    def one(name, *args):
        proc = specpipe([*TINY, *(args or ["budget.k=4"]), f"output_dir={tmp_path / name}"], tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr.splitlines()[-1], json.loads((tmp_path / name / "summary.json").read_text())

    line, summary = one("fixed-first")
    assert not (tmp_path / "cache" / "calibration").exists()
    assert summary["speedup_source"] == "plain steps" and f"~{summary['speedup_estimate']:.1f}x" in line
    line, summary = one("auto", "budget=auto")
    assert summary["speedup_source"] == "calibration" and summary["speedup_estimate"] > 0
    low, high = summary["speedup_low"], summary["speedup_high"]  # its range, when it drafted enough steps to have one
    assert low <= summary["speedup_estimate"] <= high if low else summary["speedup_high"] == 0.0
    assert f"~{summary['speedup_estimate']:.1f}x" in line and "vs plain (estimated" in line
    # the whole request beside decoding (prefill included): summary.json and the line lead with it
    assert 0 < summary["speedup_e2e_estimate"] and f"~{summary['speedup_e2e_estimate']:.1f}x" in line
    assert "end to end, decoding ~" in line
    line, summary = one("fixed-then")
    assert summary["speedup_source"] == "calibration" and "vs plain (estimated" in line


def test_without_a_curve_the_runs_plain_steps_price_its_drafting_steps():
    """The fallback: plain steps time T(1); the drafting steps' seconds (verify + draft) are priced against it."""
    from specpipe.costmodel.worth import StepLog
    from specpipe.events import Drafted, Verified

    log = StepLog()
    for step, (k, accepted, verify_s, draft_s) in enumerate([(0, 0, 0.010, 0.0), (4, 3, 0.012, 0.002)]):
        log.consume(Drafted(t=0.0, step=step, k=k, draft_ids=list(range(k)), seconds=draft_s))
        log.consume(
            Verified(
                t=0.0,
                step=step,
                accepted_ids=list(range(accepted)),
                rejected_ids=[0] * (k - accepted),
                recovered_id=1,
                seconds=verify_s,
            )
        )
    # 1 + 4 tokens over (0.010 + 0.012 + 0.002) s, at 0.010 s a plain token: 5 * 0.010 / 0.024
    assert log.estimate(None, None) == (pytest.approx(5 * 0.010 / 0.024), "plain steps")
    # with a curve: 5 tokens / (1 + 4 * 0.1 + T(5)/T(1) = 1.5)
    assert log.estimate({1: 1.0, 5: 1.5}, 0.1) == (pytest.approx(5 / 2.9), "calibration")
    only_plain = StepLog()
    only_plain.consume(Verified(t=0.0, step=0, accepted_ids=[], rejected_ids=[], bonus_id=1, seconds=0.01))
    assert only_plain.estimate(None, None) == (0.0, "")
