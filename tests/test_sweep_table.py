"""A sweep ends with one table of its jobs; the default prompt is shown above its answer (issue 51)."""

from __future__ import annotations

import subprocess
import sys

from test_faults import ENV

from specpipe.cli.sweep_table import Row, table

TINY = ["model=tiny-random", "max_tokens=12"]


def specpipe(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specpipe.cli", *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=180
    )


def test_a_multirun_ends_with_one_table_of_its_jobs(tmp_path):
    proc = specpipe(["-m", *TINY, "budget.k=2,4", "draft=ngram,none", "prompt.text=ab ab ab ab ab ab"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("sweep of 4 jobs"))
    assert "max_tokens=12" in lines[start] and "multirun" in lines[start]  # what every job shared, and where
    header, *rows = lines[start + 1 :]
    assert header.split() == ["config", "tok/forward", "acceptance", "tok/s", "estimate"]
    assert [r.split()[:2] for r in rows] == [
        ["budget.k=2", "draft=ngram"],
        ["budget.k=2", "draft=none"],
        ["budget.k=4", "draft=ngram"],
        ["budget.k=4", "draft=none"],
    ]
    summaries = [line for line in lines if line.startswith("-- ")]
    for row, summary in zip(rows, summaries, strict=True):  # the table repeats each job's own figures
        tok_forward, acceptance, tok_s = row.split()[2:5]
        assert f"| {tok_forward} tok/forward | {tok_s} tok/s |" in summary
        if "draft=none" in row:  # plain decoding: no acceptance anywhere, and no budget in its header
            assert acceptance == "-" and "acceptance" not in summary
        else:
            assert f"acceptance {acceptance} " in summary
    headers = [line for line in lines if line.startswith("specpipe: tiny-random")]
    assert ["budget=" in h for h in headers] == [True, False, True, False], headers


def test_a_single_run_prints_no_table(tmp_path):
    proc = specpipe([*TINY, "prompt.text=ab ab"], tmp_path)
    assert proc.returncode == 0 and "sweep of" not in proc.stderr


def test_the_table_names_each_job_by_what_differs():
    rows = [
        Row(("a=1", "k=4"), 2.0, 0.5, 10, 20.0, 1.4, "out/multirun/x/0"),
        Row(("a=1", "k=8"), 2.5, 0.25, 20, 19.0, 0.0, "out/multirun/x/1"),
    ]
    text = table(rows).splitlines()
    assert text[0] == "sweep of 2 jobs (every job: a=1), in out/multirun/x/<job>"
    assert text[2].split() == ["k=4", "2.00", "50%", "20.0", "~1.4x"]
    assert text[3].split() == ["k=8", "2.50", "25%", "19.0", "-"]  # no estimate: said, not 0.0x
    assert table([]) == ""


def test_the_default_prompt_is_shown_above_its_answer_and_a_typed_one_is_not(tmp_path):
    proc = specpipe(TINY, tmp_path)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0 and lines[0].startswith("specpipe: tiny-random")  # the header stays first
    assert lines[1] == 'specpipe: the default prompt (prompt=code-edit; give yours as specpipe "..."):'
    assert lines[2] == "  | Fix the bug in these functions and return the corrected code."
    typed = specpipe([*TINY, "hello there"], tmp_path)
    assert "the default prompt" not in typed.stderr
