"""The benchmark harness: suites -> JSONL -> report with plots on a tiny random
model, resume, mismatch flagging and one-line config errors. Timings are
printed by the harness, never asserted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

import specpipe.bench.measure as bench_measure
import specpipe.config.schema  # noqa: F401  (registers the schemas)
from specpipe.bench.harness import run_bench
from specpipe.bench.records import (
    config_hash,
    first_mismatch,
    load_suite,
    read_records,
    suite_names,
)
from specpipe.bench.report import main as report_main
from specpipe.bench.report import summarize, verdicts, write_report
from specpipe.events import Verified
from specpipe.metrics import StatsCollector

PLOTS = ("speedup_vs_k.png", "acceptance_by_position.png", "latency_cdf.png", "memory_vs_k.png")


@pytest.fixture
def suite_file(tmp_path) -> Path:
    path = tmp_path / "tiny.jsonl"
    rows = [
        {"id": "rep", "prompt": "ab ab ab ab ab"},
        {"id": "count", "prompt": "one two three one two three"},
        {"id": "third", "prompt": "x y z x y z x"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bench_cfg(*overrides):
    with initialize_config_module(config_module="specpipe.conf", version_base=None):
        return compose(
            config_name="bench", overrides=["model=tiny-random", "max_tokens=12", "warmup=false", *overrides]
        )


def quiet(_line):
    pass


# ---------------------------------------------------------------- units


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 9, 3]) == 1
    assert first_mismatch([1, 2, 3], [1, 2]) == 2  # a shorter output differs where it stops
    assert first_mismatch([], []) is None


def test_acceptance_by_position_counts():
    steps = [
        Verified(step=1, accepted_ids=[1, 2], rejected_ids=[3], seconds=0.0),
        Verified(step=2, accepted_ids=[], rejected_ids=[4], seconds=0.0),
        Verified(step=3, accepted_ids=[], rejected_ids=[], seconds=0.0),
    ]  # an empty draft counts nowhere
    counts = StatsCollector()
    for step in steps:
        counts.consume(step)
    assert (counts.position_drafted, counts.position_accepted) == ([2, 1, 1], [1, 1, 0])


def test_config_hash_ignores_where_and_how_many():
    a = {"model": {"name": "m"}, "budget": {"k": 4}, "limit": 2, "resume": False, "results": None}
    assert config_hash(a) == config_hash({**a, "limit": 10, "resume": True, "results": "/x.jsonl"})
    assert config_hash(a) != config_hash({**a, "budget": {"k": 8}})


def test_packaged_suites():
    assert {"code", "math", "longdoc", "prose"} <= set(suite_names())
    for name in ("code", "math", "longdoc", "prose"):
        prompts = load_suite(name)
        assert len(prompts) >= 10, name
        assert len({p["id"] for p in prompts}) == len(prompts)
    assert min(len(p["prompt"]) for p in load_suite("longdoc")) > 2000  # prefill-heavy
    assert len(load_suite("code", limit=3)) == 3


def test_longctx_suites_quote_their_document():
    """Every question's answer is a paragraph of the prompt's own document; sizes grow 1k -> 32k."""
    import json
    from importlib import resources

    for name, labels in (("longctx", ["1k", "4k", "8k"]), ("longctx-32k", ["16k", "32k"])):
        rows = [
            json.loads(line)
            for line in (resources.files("specpipe.bench.suites") / f"{name}.jsonl").read_text().splitlines()
        ]
        assert [p["id"] for p in load_suite(name)] == [r["id"] for r in rows]
        assert sorted({r["id"].split("-")[1] for r in rows}, key=labels.index) == labels
        for row in rows:
            document, question = row["prompt"].rsplit("Question:", 1)
            assert row["answer"] in document and " ".join(row["answer"].split()[:8]) in question
    sizes = {
        r["id"]: len(r["prompt"])
        for r in map(json.loads, (resources.files("specpipe.bench.suites") / "longctx.jsonl").read_text().splitlines())
    }
    assert sizes["longctx-1k-early"] * 6 < sizes["longctx-8k-early"]


# ---------------------------------------------------------------- end to end


def test_sweep_to_report_end_to_end(tmp_path, suite_file):
    """`specpipe-bench -m` on a tiny model -> one JSONL in the sweep folder -> report.md + PNGs."""
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specpipe.bench.harness",
            "-m",
            "model=tiny-random",
            "draft=ngram",
            "budget.k=2,4",
            f"suite.path={suite_file}",
            "limit=2",
            "max_tokens=16",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[bench 2/2]" in proc.stderr  # one progress line per prompt
    records = list(read_records([sweep / "bench.jsonl"]))
    assert len(records) == 4  # 2 configs x 2 prompts, both jobs in the one sweep file
    assert len({r["config_hash"] for r in records}) == 2
    for r in records:
        assert r["config"]["model"]["name"] == "tiny-random" and r["config"]["max_tokens"] == 16
        assert r["tokens_match"] and r["spec"]["token_ids"] == r["baseline"]["token_ids"]
        assert r["speedup"] > 0 and r["spec"]["latency_ms"]["p99"] >= r["spec"]["latency_ms"]["p50"]
        assert r["anchor"]["plain"]["first_mismatch"] is None  # mlx-lm's greedy tokens equal ours
    self_draft = [r for r in records if r["label"]["drafter"] == "model"]
    assert all(r["spec"]["acceptance_rate"] == 1.0 for r in self_draft)  # the target drafting for itself
    assert all(r["anchor"]["spec"]["first_mismatch"] is None for r in self_draft)

    report_main([str(sweep)])
    text = (sweep / "report.md").read_text()
    assert "**0 mismatches**" in text and "mlx-lm" in text
    for png in PLOTS:
        assert (sweep / png).stat().st_size > 1000 and f"({png})" in text


def test_mlx_lm_num_draft_tokens_sweep(tmp_path, suite_file):
    """anchor_ks runs mlx-lm once per K on the same prompt; the report picks mlx-lm's best K over the suite."""
    results = tmp_path / "bench.jsonl"
    cfg = bench_cfg(
        f"suite.path={suite_file}",
        "limit=2",
        "draft=model",
        "draft.model=self",
        "budget.k=3",
        "anchor_ks=[1,3]",
        f"results={results}",
    )
    lines = []
    records = run_bench(cfg, results, log=lines.append)
    assert any(", K=1 " in line and ", K=3 " in line for line in lines), lines  # every K of the sweep, as it runs
    for r in records:
        sweep = r["anchor"]["sweep"]
        assert set(sweep) == {"1", "3"} and r["anchor"]["spec"] is sweep["3"]
        assert all(run["first_mismatch"] is None and run["num_draft_tokens"] == int(k) for k, run in sweep.items())
    text = write_report(results).read_text()
    assert "num_draft_tokens sweep" in text and "mlx-lm K=1" in text and "mlx-lm best" in text


def test_fixed_ks_beside_auto_and_the_verdict(tmp_path, suite_file, monkeypatch):
    """fixed_ks measures specpipe's fixed K on the same drafter against the same baseline; the verdict line
    compares auto with the best of them and with mlx-lm's best K, and checks the draft forward accounting."""
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    results = tmp_path / "bench.jsonl"
    cfg = bench_cfg(
        f"suite.path={suite_file}",
        "limit=2",
        "draft=model",
        "draft.model=self",
        "budget=auto",
        "fixed_ks=[2,4]",
        "anchor_ks=[2,4]",
        f"results={results}",
    )
    records = run_bench(cfg, results, log=quiet)
    for r in records:
        assert set(r["fixed"]) == {"2", "4"}
        for run in r["fixed"].values():
            assert run["first_mismatch"] is None and run["speedup"] > 0
            assert run["draft_forwards"] <= run["drafted"] + run["steps"]  # per run, not the drafter's lifetime
        assert r["fixed"]["4"]["drafted"] > 0 and r["fixed"]["4"]["acceptance_rate"] == 1.0
        for run in (r["fixed"]["4"], *r["anchor"]["sweep"].values()):  # every path end to end, prefill included
            assert run["speedup_e2e"] > 0
    (line,) = verdicts(records)
    assert line.startswith("verdict ") and "best fixed K=" in line and "mlx-lm best K=" in line
    assert line.split(" | ")[-1].startswith(("use ", "speculation does not pay here"))
    # the verdict is the whole request's (decode beside it), and every fixed and mlx-lm K is held to it end to end
    summary = summarize(records)
    assert f"{summary['speedup_e2e']:.2f}x end to end (decode {summary['speedup']:.2f}x)" in line
    assert f"best fixed K={summary['fixed']['best_k']} {summary['fixed']['best_e2e']:.2f}x" in line
    best_e2e = max(summary["fixed"]["per_k"].values(), key=lambda k: k["speedup_e2e"])["speedup_e2e"]
    assert summary["fixed"]["best_e2e"] == best_e2e
    text = write_report(results).read_text()
    assert "budget / best fixed" in text and "## Verdict" in text
    assert "| end-to-end speed-up (min-max) | decode speed-up (min-max) |" in text
    assert "end-to-end speed-up: specpipe / mlx-lm" in text and "decode: specpipe / mlx-lm best" in text


def test_repeats_keep_the_median_run(tmp_path, suite_file):
    (r,) = run_bench(
        bench_cfg(f"suite.path={suite_file}", "limit=1", "anchor=false", "repeats=3"), tmp_path / "b.jsonl", log=quiet
    )
    for side in ("baseline", "spec"):
        speeds = r[side]["decode_tok_s_runs"]
        assert len(speeds) == 3 and r[side]["decode_tok_s"] == sorted(speeds)[1]
    assert r["speedup"] == pytest.approx(r["spec"]["decode_tok_s"] / r["baseline"]["decode_tok_s"])
    assert r["tokens_match"]


def test_resume_skips_done_pairs(tmp_path, suite_file):
    results = tmp_path / "bench.jsonl"
    cfg = bench_cfg(f"suite.path={suite_file}", "limit=2", "anchor=false", "resume=true", f"results={results}")
    first = run_bench(cfg, results, log=quiet)
    assert [r["prompt_id"] for r in first] == ["rep", "count"]
    assert run_bench(cfg, results, log=quiet) == []  # everything done: nothing loads, nothing runs
    more = bench_cfg(f"suite.path={suite_file}", "limit=3", "anchor=false", "resume=true", f"results={results}")
    assert [r["prompt_id"] for r in run_bench(more, results, log=quiet)] == ["third"]  # limit is not in the hash
    assert len(results.read_text().splitlines()) == 3


def test_mismatch_is_flagged(tmp_path, suite_file, monkeypatch):
    """A speculative run that drifts from the baseline is recorded and reported, not raised."""
    real = bench_measure.measure_specpipe

    def drifting(session, prompt_ids, max_tokens):
        record = real(session, prompt_ids, max_tokens)
        if session.drafter.name != "none":
            record["token_ids"] = record["token_ids"][:3] + [record["token_ids"][3] + 1] + record["token_ids"][4:]
        return record

    monkeypatch.setattr(bench_measure, "measure_specpipe", drifting)
    results = tmp_path / "bench.jsonl"
    (r, *_) = run_bench(bench_cfg(f"suite.path={suite_file}", "limit=1", "anchor=false"), results, log=quiet)
    assert r["tokens_match"] is False and r["first_mismatch"] == 3
    text = write_report(results).read_text()
    assert "1 MISMATCHES" in text and "MISMATCH at 3" in text


@pytest.mark.parametrize(
    "args, words",
    [
        (["suite=bogus"], "unknown option suite=bogus"),
        (["nope=1"], "unknown config key"),
        (["model=tiny-random", "suite.path=/does/not/exist.jsonl"], "does not exist"),
        (["model=tiny-random", "repeats=0"], "repeats=0"),
        (["model=tiny-random", "suite=longctx-32k", "limit=1"], "context is 4096 tokens"),  # before any prefill
        (["model=tiny-random", "kv=quantized", "kv.bits=3"], "kv.bits=3"),
        # a sweep whose second job is bad fails before the first job runs, naming the job
        (["-m", "model=tiny-random", "budget=fixed,auto", "budget.k=4"], "unknown config key 'budget.k'"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, words):
    proc = subprocess.run(
        [sys.executable, "-m", "specpipe.bench.harness", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr


def test_ctrl_c_keeps_finished_prompts(tmp_path):
    """SIGINT mid-suite: exit 130, one line, and every finished prompt is already in the JSONL."""
    suite = tmp_path / "many.jsonl"
    suite.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"count {i} {i} {i}"}) + "\n" for i in range(40)))
    results = tmp_path / "bench.jsonl"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specpipe.bench.harness",
            "model=tiny-random",
            f"suite.path={suite}",
            "limit=null",
            "max_tokens=64",
            "anchor=false",
            f"results={results}",
        ],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # a runner started in the background may ignore SIGINT; the child must not inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    while time.time() < deadline and "[bench 2/" not in proc.stderr.readline():
        pass
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "resume=true" in err
    done = list(read_records([results]))
    assert len(done) >= 2 and all(r["tokens_match"] for r in done)
