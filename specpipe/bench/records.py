"""What the benchmark reads and writes, without mlx: prompt suites, config
snapshots and their hash, the results JSONL, and the checks on token lists.

Contract: one results line is one (configuration, prompt) pair, written as
soon as it is measured and never rewritten, so Ctrl-C keeps every finished
pair and `resume` skips the (config hash, prompt key) pairs already present:
the key hashes the prompt's text, so a prompt edited under the same id is
measured again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from specpipe.errors import SpecpipeError

# Keys that choose *which* pairs run or where they go, not *what* is measured:
# changing them must not change the hash, so a resumed sweep can extend `limit`.
UNHASHED_KEYS = ("limit", "resume", "results", "warmup", "repeats")  # how much / where, not what


# ---------------------------------------------------------------- suites


def suite_names() -> list[str]:
    """Packaged suites (specpipe/bench/suites/*.jsonl)."""
    return sorted(
        p.name[: -len(".jsonl")]
        for p in resources.files("specpipe.bench.suites").iterdir()
        if p.name.endswith(".jsonl")
    )


def load_suite(
    name: str,
    path: str | None = None,
    limit: int | None = None,
    fmt: str = "jsonl",
    per_category: int | None = None,
    second_turns: bool = False,
) -> list[dict]:
    """Prompts of a suite as [{"id", "prompt"}] (plus "category" for Spec-Bench), in file order.

    Args:
        name: a packaged suite name (code, math, longdoc, prose); ignored when `path` is set.
        path: a JSONL file with one {"id": str, "prompt": str} object per line.
        limit: keep the first `limit` prompts (None: all).
        fmt: "jsonl" ({"id", "prompt"} lines) or "spec-bench" (Spec-Bench's question.jsonl: spec_bench.py).
        per_category: Spec-Bench only: this many questions of each of its six categories (None: all).
        second_turns: Spec-Bench only: each MT-Bench question's second turn after its first (spec_bench.py).
    """
    if fmt not in ("jsonl", "spec-bench"):
        raise SpecpipeError(f'suite.format={fmt}: choose jsonl ({{"id", "prompt"}} lines) or spec-bench')
    if fmt == "spec-bench" and not path:
        raise SpecpipeError(
            "suite.format=spec-bench needs suite.path=question.jsonl "
            "(Spec-Bench's data/spec_bench/question.jsonl; specpipe does not ship it)"
        )
    source: Path | str
    if path:
        source = Path(path)
        if not source.is_file():
            raise SpecpipeError(f'suite.path={path} does not exist: give a JSONL file of {{"id", "prompt"}} lines')
        try:
            text = source.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise SpecpipeError(f"suite.path={path} is not UTF-8 text (byte {exc.start}): give a JSONL file") from exc
    else:
        packaged = resources.files("specpipe.bench.suites") / f"{name}.jsonl"
        if not packaged.is_file():
            raise SpecpipeError(f"unknown suite {name!r}: choose one of {', '.join(suite_names())}, or set suite.path")
        text, source = packaged.read_text(encoding="utf-8"), name
    if fmt == "spec-bench":
        from specpipe.bench.spec_bench import read_spec_bench

        prompts = read_spec_bench(text, source, per_category, second_turns)
    else:
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompt: dict = {"id": str(row["id"]), "prompt": str(row["prompt"])}
                if "session" in row:  # a multi-request suite (suite=sessions): requests of one session share history
                    prompt["session"] = str(row["session"])
                    prompt["history"] = bool(row.get("history", False))  # what it repeats is in earlier answers only
                if "system" in row:  # this request's own system prompt (an agent's), over suite.system
                    prompt["system"] = str(row["system"])
                prompts.append(prompt)
            except (ValueError, KeyError, TypeError) as exc:
                raise SpecpipeError(f'suite {source} line {n}: expected {{"id", "prompt"}} JSON ({exc})') from exc
    ids = [p["id"] for p in prompts]
    if len(set(ids)) != len(ids):
        raise SpecpipeError(f"suite {source}: prompt ids must be unique")
    if limit is not None and limit < 1:
        raise SpecpipeError(f"limit={limit}: must be at least 1 (or null for the whole suite)")
    return prompts[:limit] if limit is not None else prompts


# ---------------------------------------------------------------- config identity


def config_hash(snapshot: dict) -> str:
    """A short stable hash of what a configuration measures (see UNHASHED_KEYS)."""
    measured = {k: v for k, v in snapshot.items() if k not in UNHASHED_KEYS}
    return hashlib.sha256(json.dumps(measured, sort_keys=True, default=str).encode()).hexdigest()[:12]


def prompt_key(prompt: dict) -> str:
    """A short hash of what a prompt asks: its text, and for a second turn the text of the turn it follows; a
    session's request also by its id (suite=sessions asks the same words twice, as a retrying agent does)."""
    asked = {"prompt": prompt["prompt"], "after": (prompt.get("after") or {}).get("prompt")}
    if "session" in prompt:
        asked["request"] = prompt["id"]
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- results file


class ResultsFile:
    """Append-only JSONL of per-prompt records; each line is flushed at once."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def records(self) -> list[dict]:
        return list(read_records([self.path])) if self.path.exists() else []

    def done_pairs(self) -> set[tuple[str, str | None]]:
        """(config hash, prompt key) of every record (a record from before prompt keys has None: measured again)."""
        return {(r["config_hash"], r.get("prompt_key")) for r in self.records()}

    def append(self, record: dict) -> None:
        """Append one line. Sweep jobs run by a launcher (joblib, submitit) are separate processes
        writing to the same sweep file: one locked write per record keeps every line whole."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(record) + "\n").encode("utf-8")
        with open(self.path, "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.write(line)
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def read_records(paths: Iterable[Path]) -> Iterable[dict]:
    """Every record of the given JSONL files; a torn last line (killed mid-write) is skipped."""
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError:
                    continue


# ---------------------------------------------------------------- checks and per-run figures


def first_mismatch(expected: list[int], actual: list[int]) -> int | None:
    """Index of the first position where two token lists differ, None if equal.

    A list that is a strict prefix of the other differs at its length:
    first_mismatch([5, 6, 7], [5, 6]) == 2; first_mismatch([5, 6], [5, 9]) == 1.
    """
    for i, (a, b) in enumerate(zip(expected, actual)):
        if a != b:
            return i
    return None if len(expected) == len(actual) else min(len(expected), len(actual))
