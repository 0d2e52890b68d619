"""Spec-Bench's question.jsonl as a bench suite (suite.format=spec-bench): first turns under its six task
categories, an evenly spaced draw per category, one-line errors, and a report with per-category speed-up,
mean accepted tokens per step and time to first token beside plain's. The file here is built in Spec-Bench's
format (question_id, category, turns; the public file is github.com/hemingkx/Spec-Bench
data/spec_bench/question.jsonl, not shipped with specpipe)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

import specpipe.config.schema  # noqa: F401  (registers the schemas)
from specpipe.bench.harness import run_bench
from specpipe.bench.records import load_suite
from specpipe.bench.report import write_report
from specpipe.errors import SpecpipeError

# categories as Spec-Bench's file has them: MT-Bench's own eight, then the five other tasks
CATEGORIES = ["writing", "roleplay", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"]


@pytest.fixture
def questions(tmp_path) -> Path:
    rows, qid = [], 81
    for cat in CATEGORIES:
        for i in range(4):
            rows.append({"question_id": qid, "category": cat, "turns": [f"{cat} {i}: a b a b a b", "second turn"]})
            qid += 1
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_first_turns_under_spec_benchs_six_tasks(questions):
    prompts = load_suite("", str(questions), fmt="spec-bench")
    assert len(prompts) == 32 and prompts[0] == {
        "id": "mt_bench-81",
        "prompt": "writing 0: a b a b a b",
        "category": "mt_bench",
        "question": {"question_id": 81, "category": "writing"},
    }
    assert list(dict.fromkeys(p["category"] for p in prompts)) == [
        "mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"
    ]  # fmt: skip


def test_mt_bench_second_turns_follow_their_first(questions):
    prompts = load_suite("x", str(questions), None, "spec-bench", 1, second_turns=True)
    ids = [p["id"] for p in prompts]
    assert ids[:2] == [ids[0], ids[0] + "-turn2"] and sum(i.endswith("-turn2") for i in ids) == 1
    second = prompts[1]
    assert second["prompt"] == "second turn" and second["after"] == {"id": ids[0], "prompt": prompts[0]["prompt"]}
    assert [p["id"] for p in load_suite("x", str(questions), None, "spec-bench", 1)] == [ids[0], *ids[2:]]


def test_per_category_draws_evenly_spaced_questions_the_same_every_time(questions):
    drawn = load_suite("", str(questions), fmt="spec-bench", per_category=3)
    assert len(drawn) == 18 and drawn == load_suite("", str(questions), fmt="spec-bench", per_category=3)
    mt = [p["id"] for p in drawn if p["category"] == "mt_bench"]
    assert mt == ["mt_bench-83", "mt_bench-87", "mt_bench-91"]  # rows 2, 6, 10 of 12: writing, roleplay, coding
    assert [p["id"] for p in drawn if p["category"] == "rag"] == ["rag-109", "rag-111", "rag-112"]


@pytest.mark.parametrize(
    "content, words",
    [('{"question_id": 1, "category": "qa"}', "line 1"), ('{"id": "x", "prompt": "y"}', "Spec-Bench question")],
)
def test_a_file_of_another_shape_is_one_line(tmp_path, content, words):
    path = tmp_path / "q.jsonl"
    path.write_text(content + "\n")
    with pytest.raises(SpecpipeError, match=words) as err:
        load_suite("", str(path), fmt="spec-bench")
    assert "\n" not in str(err.value)


def test_format_and_path_are_checked(tmp_path):
    with pytest.raises(SpecpipeError, match="needs suite.path"):
        load_suite("code", None, fmt="spec-bench")
    with pytest.raises(SpecpipeError, match="suite.format=csv"):
        load_suite("code", None, fmt="csv")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpecpipeError, match="not UTF-8"):
        load_suite("", str(binary))


def _spec_bench_cfg(questions, results, max_tokens: int):
    """specpipe-bench over the questions file, one per category, plain beside the default drafter and K = 2."""
    with initialize_config_module(config_module="specpipe.conf", version_base=None):
        return compose(
            config_name="bench",
            overrides=[
                "model=tiny-random",
                f"max_tokens={max_tokens}",
                "warmup=false",
                "anchor=false",
                "suite.format=spec-bench",
                f"suite.path={questions}",
                "suite.per_category=1",
                "limit=null",
                "fixed_ks=[2]",
                f"results={results}",
            ],
        )


def test_bench_reports_each_category_with_ttft(tmp_path, questions, monkeypatch):
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    results = tmp_path / "bench.jsonl"
    cfg = _spec_bench_cfg(questions, results, max_tokens=8)
    records = run_bench(cfg, results, log=lambda _line: None)
    assert [r["category"] for r in records] == [
        "mt_bench",
        "mt_bench",  # its second turn, after the first answer
        "translation",
        "summarization",
        "qa",
        "math_reasoning",
        "rag",
    ]
    first, second = records[0], records[1]
    assert (first["turn"], second["turn"]) == (1, 2) and second["prompt_id"] == first["prompt_id"] + "-turn2"
    # the second turn's context holds the first turn and plain decoding's answer to it
    assert second["prompt_tokens"] > first["prompt_tokens"] + len(first["baseline"]["token_ids"])
    assert second["tokens_match"]
    text = write_report(results).read_text()
    section = text[text.index("## Per category (Spec-Bench)") :]
    for cat in ("mt_bench", "rag", "all"):
        assert f"| {cat} | " in section
    assert "tokens/step" in section and "worst TTFT ratio" in section and "K=2" in section
    assert "| category | questions | end-to-end speed-up | worst | decode speed-up |" in section
    assert "TTFT s plain / spec" in text and "BLAS threads:" in text
    assert "Spec-Bench speed()" in section


def test_bench_writes_spec_bench_answer_files(tmp_path, questions, monkeypatch):
    """One line per question in Spec-Bench's answer schema: plain decoding's file, the budget's and each fixed K's;
    MT-Bench's two turns in one line under its own subcategory; accept_lengths sum to the new tokens."""
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    results = tmp_path / "bench.jsonl"
    cfg = _spec_bench_cfg(questions, results, max_tokens=6)
    records = run_bench(cfg, results, log=lambda _line: None)
    files = sorted((tmp_path / "spec_bench").glob("*.jsonl"))
    names = [f.name.rsplit("-", 1)[0] for f in files]
    assert names == ["tiny-random-llama-ngram", "tiny-random-llama-ngram-k2", "tiny-random-llama-plain"]
    plain, spec = (
        [json.loads(line) for line in (tmp_path / "spec_bench" / f).read_text().splitlines()]
        for f in (files[2].name, files[0].name)
    )
    assert [line["question_id"] for line in plain] == [87, 95, 99, 103, 107, 111]
    assert plain[0]["category"] == "roleplay" and plain[1]["category"] == "translation"
    for a, b in zip(plain, spec, strict=True):
        ca, cb = a["choices"][0], b["choices"][0]
        assert ca["turns"] == cb["turns"] and all(isinstance(t, str) and t for t in ca["turns"])
        for c in (ca, cb):
            assert sum(c["accept_lengths"]) == sum(c["new_tokens"]) and all(w > 0 for w in c["wall_time"])
            assert len(c["turns"]) == len(c["new_tokens"]) == len(c["wall_time"]) == len(c["decoding_steps"])
        assert set(a) == {"question_id", "category", "answer_id", "model_id", "tstamp", "choices"}
    assert len(plain[0]["choices"][0]["turns"]) == 2  # the MT-Bench question's second turn joins its first
    first = records[0]
    assert plain[0]["choices"][0]["wall_time"][0] == first["baseline"]["wall_s"]
