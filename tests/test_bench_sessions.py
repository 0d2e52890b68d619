"""suite=sessions (bench/sessions.py): the packaged file is what the generator writes, and specpipe-bench runs each
session's requests in order with draft=suffix's store carried between them and cleared between sessions: a
session's first request drafts as if it ran alone, later ones draft from the earlier answers; every greedy output
is plain decoding's."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_module

import specpipe.config.schema  # noqa: F401  (registers the schemas and resolvers)
from specpipe.bench.harness import run_bench
from specpipe.bench.sessions import packaged_path, session_prompts, suite_text
from specpipe.errors import SpecpipeError


def _cfg(*overrides):
    with initialize_config_module(config_module="specpipe.conf", version_base=None):
        return compose(
            config_name="bench",
            overrides=[
                "model=tiny-random",
                "max_tokens=16",
                "warmup=false",
                "anchor=false",
                "limit=null",
                "draft=suffix",
                "budget.k=8",
                *overrides,
            ],
        )


def test_the_packaged_suite_is_the_generators():
    assert packaged_path().read_text(encoding="utf-8") == suite_text()
    rows = session_prompts()
    history = ["retry"] * 3 + ["sql"] * 4 + ["function"] * 3 + ["faq"] * 4
    assert [r["session"] for r in rows] == history + ["edit"] * 4 + ["tool"] * 4 + ["chat"] * 3
    assert [r["history"] for r in rows] == [True] * len(history) + [False] * 11
    # the prompt sessions repeat themselves: each edit request resends the file the previous one asked for back
    edit = [r for r in rows if r["session"] == "edit"]
    assert edit[0]["prompt"][200:600] in edit[1]["prompt"]
    # the history sessions ask again, each a fresh conversation: the same words (a retry, a second client)
    # or a variant, so what repeats is the earlier answer
    assert rows[0]["prompt"] == rows[1]["prompt"] != rows[2]["prompt"]
    assert all(r["system"] for r in rows[: len(history)])


def test_sessions_carry_history_within_and_clear_it_between(tmp_path):
    lines: list[str] = []
    records = run_bench(_cfg("suite=sessions"), tmp_path / "all.jsonl", log=lines.append)
    assert all(r["tokens_match"] for r in records)
    assert [r["session"] for r in records] == [r["session"] for r in session_prompts()]
    assert sum(line.startswith("[bench session ") for line in lines) == 7, lines
    assert [line.split(":")[0] for line in lines if line.startswith("[bench sessions]")] == [
        f"[bench sessions] {kind} sessions" for kind in ("history", "prompt", "all")
    ]
    # a retry asks the same words in a fresh conversation: its answer is drafted from the first one's, as history
    retry = [r["spec"]["accepted_by_source"].get("history", 0) for r in records if r["session"] == "retry"]
    assert retry[0] == 0 and retry[1] >= 8, retry
    # the tool session alone, from its own file: its first request drafts exactly as inside the whole suite
    # (the edit session's history was cleared), and its later requests exactly as well (history carried)
    alone_file = tmp_path / "tool.jsonl"
    alone_file.write_text("".join(json.dumps(r) + "\n" for r in session_prompts() if r["session"] == "tool"))
    alone = run_bench(_cfg(f"suite.path={alone_file}"), tmp_path / "tool-out.jsonl", log=lines.append)
    inside = [r for r in records if r["session"] == "tool"]
    assert [r["spec"]["drafted"] for r in alone] == [r["spec"]["drafted"] for r in inside]
    assert [r["spec"]["accepted"] for r in alone] == [r["spec"]["accepted"] for r in inside]
    # and the history matters: each request again with the store cleared before it drafts less
    cleared_file = tmp_path / "cleared.jsonl"
    cleared_file.write_text(
        "".join(json.dumps({**r, "session": r["id"]}) + "\n" for r in session_prompts() if r["session"] == "tool")
    )
    cleared = run_bench(_cfg(f"suite.path={cleared_file}"), tmp_path / "cleared-out.jsonl", log=lines.append)
    assert sum(r["spec"]["accepted"] for r in cleared) < sum(r["spec"]["accepted"] for r in inside)


def test_repeats_are_refused_in_one_line(tmp_path):
    with pytest.raises(SpecpipeError) as caught:
        run_bench(_cfg("suite=sessions", "repeats=3"), tmp_path / "x.jsonl", log=lambda _: None)
    assert "repeats=1" in str(caught.value) and "\n" not in str(caught.value)
