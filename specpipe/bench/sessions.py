"""The `sessions` suite: multi-request workloads where later requests repeat earlier text, the way coding agents,
editors, tool loops and servers do. Generated here, with no download; `python -m specpipe.bench.sessions` rewrites
the packaged specpipe/bench/suites/sessions.jsonl (tests/test_bench_sessions.py checks the two agree).

Contract: `session_prompts()` returns [{"id", "session", "history", "prompt", ("system")}] in request order.
specpipe-bench runs a session's requests one after another with draft=suffix's store carried between them and
cleared between sessions (harness.py), and reports each request and each session. Every request is a fresh
conversation (its own system prompt and instruction, no earlier turns). Two kinds of session:
- history (`"history": true`): what a later request repeats is in an earlier *answer*, not in its own prompt, so
  only a drafter that remembers earlier requests finds it (SuffixDecoding's agentic case):
  - retry: an agent re-asks for the same plan after a reset of its context (the same request, then a variant);
  - sql: an agent asks for variants of one SQL query over the same schema (AgenticSQL-like);
  - function: a code generator asked for variants of one function;
  - faq: several clients asking the same question, in the same or other words.
- prompt (`"history": false`): the repeated text is in the request's own prompt, so prompt lookup finds it too
  (history adds little; kept as the honest other case):
  - edit: one source file edited in four steps; each request sends the current file and asks for all of it back.
  - tool: a tool loop that re-reads a JSON object and asks for it back updated after each tool result.
  - chat: a conversation that quotes an earlier plan and asks for it restated with one change each turn.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

SOURCE = """import json
from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    quantity: int
    price: float


@dataclass
class Inventory:
    items: dict[str, Item] = field(default_factory=dict)

    def add(self, name: str, quantity: int, price: float) -> None:
        if name in self.items:
            self.items[name].quantity += quantity
        else:
            self.items[name] = Item(name, quantity, price)

    def remove(self, name: str, quantity: int) -> None:
        item = self.items[name]
        item.quantity -= quantity
        if item.quantity <= 0:
            del self.items[name]

    def total_value(self) -> float:
        return sum(item.quantity * item.price for item in self.items.values())

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({name: vars(item) for name, item in self.items.items()}, f)
"""

# (instruction, old text, new text): each edit applied to the file the next request sends
EDITS = [
    ("rename the method `total_value` to `value`", "def total_value(self)", "def value(self)"),
    (
        "make `remove` raise KeyError with a clear message when the item is missing",
        "        item = self.items[name]\n",
        '        if name not in self.items:\n            raise KeyError(f"no item named {name}")\n'
        "        item = self.items[name]\n",
    ),
    (
        "add a method `names(self) -> list[str]` that returns the item names sorted, after `remove`",
        "    def value(self)",
        "    def names(self) -> list[str]:\n        return sorted(self.items)\n\n    def value(self)",
    ),
    (
        "write the JSON file with indent=2",
        "json.dump({name: vars(item) for name, item in self.items.items()}, f)",
        "json.dump({name: vars(item) for name, item in self.items.items()}, f, indent=2)",
    ),
]

STATE = {
    "task": "migrate the billing service",
    "status": "running",
    "steps_done": 0,
    "files_changed": [],
    "tests": {"passed": 0, "failed": 0},
    "notes": "",
}

# (tool result sentence, the state update it implies)
TOOL_RESULTS = [
    ("edit_file changed billing/models.py", {"steps_done": 1, "files_changed": ["billing/models.py"]}),
    ("run_tests reported 41 passed and 2 failed", {"tests": {"passed": 41, "failed": 2}}),
    (
        "edit_file changed billing/invoice.py",
        {"steps_done": 2, "files_changed": ["billing/models.py", "billing/invoice.py"]},
    ),
    ("run_tests reported 43 passed and 0 failed", {"tests": {"passed": 43, "failed": 0}, "status": "done"}),
]

PLAN = [
    "Read the failing test and the function it calls.",
    "Write a smaller test that reproduces the failure.",
    "Fix the off-by-one error in the loop bound.",
    "Run the whole test suite and check nothing else broke.",
    "Write a short note in the changelog.",
]

PLAN_CHANGES = [
    (2, "Fix the loop bound and add a comment that explains it."),
    (4, "Write a short note in the changelog and in the release notes."),
    (0, "Read the failing test, the function it calls and its git history."),
]


AGENT_SYSTEM = "You are a coding agent working in a Python repository. Answer with what is asked and nothing else."

RETRY_TASK = (
    "The test `test_parse_dates` fails with ValueError on the input '{date}'. "
    "Write a numbered plan of at most six steps to fix it."
)
RETRY_DATES = ["2024-02-30", "2024-02-30", "2023-13-01"]  # the same request after a reset, then a variant

SQL_SCHEMA = (
    "Tables: customers(id, name, country) and orders(id, customer_id, total, created_at). "
    "Write one SQL query that returns {what}. Reply with the query only."
)
SQL_ASKS = [
    "the 5 customers with the highest total order value in 2023, with their names and totals",
    "the 5 customers with the highest total order value in 2024, with their names and totals",
    "the 10 customers with the highest total order value in 2023, with their names and totals",
    "the 5 customers from Germany with the highest total order value in 2023, with their names and totals",
]

FUNCTION_ASKS = [
    "Write a Python function `parse_duration(text: str) -> int` that converts strings like '1h30m' or '45s' "
    "into seconds. Reply with the code only.",
    "Write a Python function `parse_duration(text: str) -> int` that converts strings like '1h30m' or '45s' "
    "into seconds, with a docstring. Reply with the code only.",
    "Write a Python function `parse_duration(text: str) -> int` that converts strings like '2h15m' or '30s' "
    "into seconds and raises ValueError on anything else. Reply with the code only.",
]

FAQ_ASKS = [  # one question from several clients: twice the same words, then other words
    "What is the difference between a list and a tuple in Python?",
    "What is the difference between a list and a tuple in Python?",
    "What is the difference between a tuple and a list in Python?",
    "In Python, what is the difference between a list and a tuple?",
]


def _history_sessions() -> list[tuple[str, list[str]]]:
    return [
        ("retry", [RETRY_TASK.format(date=d) for d in RETRY_DATES]),
        ("sql", [SQL_SCHEMA.format(what=w) for w in SQL_ASKS]),
        ("function", list(FUNCTION_ASKS)),
        ("faq", list(FAQ_ASKS)),
    ]


def _edit_session() -> list[str]:
    prompts, text = [], SOURCE
    for instruction, old, new in EDITS:
        prompts.append(
            "You are editing `inventory.py`. Here is the current file:\n```python\n"
            f"{text}```\nChange: {instruction}. Reply with the whole updated file only."
        )
        assert old in text, old  # the suite's own edits must apply
        text = text.replace(old, new, 1)
    return prompts


def _tool_session() -> list[str]:
    prompts, state = [], json.loads(json.dumps(STATE))
    for result, update in TOOL_RESULTS:
        prompts.append(
            "The tool `read_state` returned this JSON object:\n"
            f"{json.dumps(state, indent=2)}\nThen the tool {result}. "
            "Return the whole JSON object updated to match, and nothing else."
        )
        state.update(update)
    return prompts


def _chat_session() -> list[str]:
    prompts, plan = [], list(PLAN)
    for step, new in PLAN_CHANGES:
        listed = "\n".join(f"{i + 1}. {line}" for i, line in enumerate(plan))
        prompts.append(
            f"Earlier you proposed this plan:\n{listed}\n"
            f"Restate the whole plan, numbered, with step {step + 1} changed to: {new}"
        )
        plan[step] = new
    return prompts


def session_prompts() -> list[dict]:
    """Every request of the suite, session after session, each session's in order: the history sessions first
    (`limit=14` runs those alone)."""
    rows = []
    for name, prompts in _history_sessions():
        rows += [
            {"id": f"{name}-{i + 1}", "session": name, "history": True, "system": AGENT_SYSTEM, "prompt": p}
            for i, p in enumerate(prompts)
        ]
    for name, prompts in (("edit", _edit_session()), ("tool", _tool_session()), ("chat", _chat_session())):
        rows += [
            {"id": f"{name}-{i + 1}", "session": name, "history": False, "prompt": p} for i, p in enumerate(prompts)
        ]
    return rows


def session_line(records: list[dict]) -> str:
    """One session's figures over its requests: tokens per target forward, the decode speed-up (tokens over
    decode seconds summed, so a long request weighs as its time does) and the drafts from history."""
    per_request = ", ".join(f"{r['prompt_id']} {r['speedup']:.2f}x" for r in records)
    return f"[bench session {records[0]['session']}] {group_figures(records)} ({per_request})"


def suite_lines(records: list[dict]) -> list[str]:
    """The suite's totals: over the history sessions, the prompt sessions, and all of them."""
    groups = [
        ("history sessions", [r for r in records if r.get("history")]),
        ("prompt sessions", [r for r in records if not r.get("history")]),
        ("all sessions", records),
    ]
    return [f"[bench sessions] {name}: {group_figures(rows)}" for name, rows in groups if rows]


def group_figures(records: list[dict]) -> str:
    """ "N requests: T tokens/forward (plain P), decode S x, history accepted/drafted" over `records`."""

    def totals(run: str) -> tuple[int, int, float]:
        rows = [r[run] for r in records]
        tokens = sum(x["generated_tokens"] for x in rows)
        forwards = sum(x["target_forwards"] for x in rows)
        seconds = sum(x["generated_tokens"] / x["decode_tok_s"] for x in rows if x["decode_tok_s"])
        return tokens, forwards, seconds

    b_tokens, b_forwards, b_seconds = totals("baseline")
    s_tokens, s_forwards, s_seconds = totals("spec")
    speedup = (s_tokens / s_seconds) / (b_tokens / b_seconds) if s_seconds and b_seconds else 0.0
    drafted = sum(r["spec"].get("drafted_by_source", {}).get("history", 0) for r in records)
    accepted = sum(r["spec"].get("accepted_by_source", {}).get("history", 0) for r in records)
    history = f", from history {accepted}/{drafted} accepted/drafted" if drafted else ""
    return (
        f"{len(records)} requests: {s_tokens / max(s_forwards, 1):.2f} tokens/forward "
        f"(plain {b_tokens / max(b_forwards, 1):.2f}), decode {speedup:.2f}x{history}"
    )


def suite_text() -> str:
    return "".join(json.dumps(row) + "\n" for row in session_prompts())


def packaged_path() -> Path:
    return Path(str(resources.files("specpipe.bench.suites") / "sessions.jsonl"))


if __name__ == "__main__":
    packaged_path().write_text(suite_text(), encoding="utf-8")
    print(f"wrote {packaged_path()}", file=sys.stderr)
