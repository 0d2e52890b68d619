"""Spec-Bench answer files from bench records, so Spec-Bench's own evaluation can check a speed-up.

Contract: `answer_lines(records, run, decode)` turns one configuration's records of a Spec-Bench suite into
Spec-Bench answer lines, one per question (an MT-Bench question's two turns in one line), in the schema of
Spec-Bench's `evaluation/speed.py` and `equal.py`: question_id, category (as in question.jsonl, MT-Bench's own
subcategories), answer_id, model_id, tstamp, choices [{index, turns, decoding_steps, new_tokens, wall_time,
accept_lengths}] with per-turn lists, `wall_time` including prefill and `accept_lengths` the tokens each target
forward emitted. `write_answer_files` writes plain decoding's file and one per configuration (the budget's run
and each fixed K) beside the results. `mean_speed` is speed()'s statistic (mean over questions of new tokens /
wall seconds); the bench report divides two of them so its figure and Spec-Bench's can be compared. Records
without a Spec-Bench question are skipped; nothing here times or runs a model.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

ANSWERS_DIR = "spec_bench"  # beside the results JSONL


def _run_of(record: dict, run: str) -> dict | None:
    """`run` is "baseline", "spec" or a fixed K ("4"): that run's figures in the record."""
    if run in ("baseline", "spec"):
        return record.get(run)
    return (record.get("fixed") or {}).get(run)


def answer_lines(records: list[dict], run: str, decode: Callable[[list[int]], str] | None = None) -> list[dict]:
    """Spec-Bench answer lines of `run` over `records` (one configuration), questions in first-seen order.

    Args:
        records: bench records; those without a `question` (not a Spec-Bench suite) are skipped.
        run: "baseline" (plain decoding), "spec" (the configured budget) or a fixed K as a string.
        decode: token ids -> text for `turns` (None: turns are left empty, as the report needs no text).

    Returns:
        One dict per question; a question whose turn is missing from the records keeps the turns it has.
    """
    by_question: dict[object, list[dict]] = {}
    for r in records:
        if r.get("question") and _run_of(r, run) is not None:
            by_question.setdefault(r["question"]["question_id"], []).append(r)
    lines = []
    for qid, turns in by_question.items():
        turns = sorted(turns, key=lambda r: r.get("turn", 1))
        runs = [_run_of(r, run) or {} for r in turns]
        first = turns[0]
        choice = {
            "index": 0,
            "turns": [decode(x["token_ids"]) if decode else "" for x in runs],
            "decoding_steps": [len(x.get("emitted_per_step") or []) for x in runs],
            "new_tokens": [int(x["generated_tokens"]) for x in runs],
            "wall_time": [float(x["wall_s"]) for x in runs],  # prefill included, as Spec-Bench times a turn
            "accept_lengths": [n for x in runs for n in (x.get("emitted_per_step") or [])],
        }
        stamp = datetime.fromisoformat(turns[-1]["time"]).timestamp() if turns[-1].get("time") else 0.0
        model_id = model_id_of(first, run)
        answer_id = hashlib.sha256(f"{first.get('config_hash')}/{run}/{qid}".encode()).hexdigest()[:22]
        lines.append(
            {
                "question_id": qid,
                "category": first["question"]["category"],
                "answer_id": answer_id,
                "model_id": model_id,
                "tstamp": stamp,
                "choices": [choice],
            }
        )
    return lines


def model_id_of(record: dict, run: str) -> str:
    """A file-safe model_id: `smollm2-135m-plain-<hash>`, `smollm2-135m-ngram-<hash>`, `...-ngram-k4-<hash>`."""
    label = record["label"]
    what = "plain" if run == "baseline" else label["drafter"] if run == "spec" else f"{label['drafter']}-k{run}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{label['model']}-{what}-{record['config_hash'][:8]}")


def write_answer_files(records: list[dict], directory: Path, decode: Callable[[list[int]], str]) -> list[Path]:
    """Plain decoding's answer file and one per configuration run (budget, each fixed K) of one config hash.

    Returns:
        The files written (rewritten whole, so a resumed run's file holds every question measured so far).
    """
    if not any(r.get("question") for r in records):
        return []
    fixed = sorted({k for r in records for k in (r.get("fixed") or {})}, key=int)
    written = []
    for run in ("baseline", "spec", *fixed):
        lines = answer_lines(records, run, decode)
        if not lines:
            continue
        path = Path(directory) / f"{lines[0]['model_id']}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        tmp.replace(path)
        written.append(path)
    return written


def mean_speed(lines: list[dict]) -> float:
    """Spec-Bench speed()'s statistic: the mean over questions of (new tokens / wall seconds) summed over turns.

    speed() counts the baseline's tokens by re-encoding its text (minus one token for a BOS); for a tokenizer
    without a BOS that counts one token fewer per turn than were generated.
    """
    speeds = [sum(c["new_tokens"]) / sum(c["wall_time"]) for c in (line["choices"][0] for line in lines)]
    speeds = [s for s in speeds if s > 0]
    return sum(speeds) / len(speeds) if speeds else 0.0


def spec_bench_speedup(records: list[dict], run: str = "spec") -> float | None:
    """Spec-Bench's speed-up of `run` over plain decoding for these records (None: no Spec-Bench question)."""
    ours, plain = mean_speed(answer_lines(records, run)), mean_speed(answer_lines(records, "baseline"))
    return ours / plain if ours and plain else None
