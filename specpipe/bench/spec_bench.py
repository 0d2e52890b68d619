"""Spec-Bench's questions as a bench suite (`suite.format=spec-bench suite.path=question.jsonl`).

Contract: `read_spec_bench(text, source, per_category)` turns Spec-Bench's `question.jsonl` (one
{"question_id", "category", "turns"} object per line; github.com/hemingkx/Spec-Bench,
data/spec_bench/question.jsonl) into prompts [{"id", "prompt", "category", "question"}]: each question's first
turn, under one of Spec-Bench's six task categories (MT-Bench's eight subcategories are its
"mt_bench"; `question` keeps the row's own question_id and category for its answer files).
`per_category=N` keeps N questions per category, evenly spaced through each category's
questions in file order, so the draw is the same every time. With `second_turns`, each drawn MT-Bench
question's second turn follows its first as a prompt of its own, `{"id": "<first id>-turn2", "prompt": the second
turn, "after": {"id", "prompt"} of the first}`: as Spec-Bench runs it, the second turn is asked with the first
turn and the target's own answer to it in the context (bench/harness.py builds that conversation).
specpipe does not ship the file.
"""

from __future__ import annotations

import json

from specpipe.errors import SpecpipeError

# Spec-Bench's "multi-turn conversation" task is MT-Bench, whose rows carry MT-Bench's own categories
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def task_of(category: str) -> str:
    """Spec-Bench's task for a row's category: mt_bench, translation, summarization, qa, math_reasoning, rag."""
    return "mt_bench" if category in MT_BENCH else category


def read_spec_bench(
    text: str, source: object, per_category: int | None = None, second_turns: bool = False
) -> list[dict]:
    """Prompts of a Spec-Bench question file, first turns (and MT-Bench's second turns), in file order.

    Example: 80 summarization rows and per_category=3 keep rows 13, 40 and 66 (0-based: (i + 1/2) 80 / 3).

    Raises:
        SpecpipeError: a line that is not a Spec-Bench question (names the line and what to give).
    """
    by_task: dict[str, list[dict]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = row["turns"]
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise ValueError("turns must be a list of strings")
            task = task_of(str(row["category"]))
            # `question`: Spec-Bench's own identity of the row, for its answer files (bench/answer_files.py)
            question = {"question_id": row["question_id"], "category": str(row["category"])}
            prompt = {
                "id": f"{task}-{row['question_id']}",
                "prompt": turns[0],
                "category": task,
                "turns": turns,
                "question": question,
            }
        except (ValueError, KeyError, TypeError) as exc:
            raise SpecpipeError(
                f'suite {source} line {n}: expected a Spec-Bench question {{"question_id", "category", "turns"}} '
                f'({exc}); suite.format=jsonl reads {{"id", "prompt"}} lines'
            ) from exc
        by_task.setdefault(task, []).append(prompt)
    if per_category is None:
        return _with_second_turns([p for rows in by_task.values() for p in rows], second_turns)
    if per_category < 1:
        raise SpecpipeError(f"suite.per_category={per_category}: keep at least 1 question per category (or null: all)")
    picked = []
    for rows in by_task.values():
        m = len(rows)
        picked += [rows[int((i + 0.5) * m / per_category)] for i in range(min(per_category, m))]
    order = {p["id"]: i for i, p in enumerate(p for rows in by_task.values() for p in rows)}
    return _with_second_turns(sorted(picked, key=lambda p: order[p["id"]]), second_turns)


def _with_second_turns(prompts: list[dict], second_turns: bool) -> list[dict]:
    """Each MT-Bench prompt followed by its second turn (when asked and the question has one)."""
    out = []
    for p in prompts:
        turns = p.pop("turns")
        out.append(p)
        if second_turns and p["category"] == "mt_bench" and len(turns) > 1 and isinstance(turns[1], str):
            after = {"id": p["id"], "prompt": p["prompt"]}
            second = {"id": f"{p['id']}-turn2", "prompt": turns[1], "category": "mt_bench", "after": after}
            out.append({**second, "question": p["question"]})
    return out
