"""The batch-1 server's one budget sees every request as a new one, whatever its max_tokens.

`serve/worker.py` decodes every request through the session's one budget. budget=auto once inferred a new
request from the room (tokens still wanted) growing, so a request whose max_tokens was below the room the
last one stopped at (a client that left, a stop string) was taken for the same request: its carry-over
and probe reset were skipped. Now both drivers call `Budget.start_request()`. The packaged SmolLM2 with
n-gram drafts, real forwards, two requests in-process (no HTTP: the worker is what shares the budget).
"""

from __future__ import annotations

import pytest
from hydra import compose, initialize

import specpipe.config.schema  # noqa: F401  (registers the schemas)
from specpipe.budgets.rates import CARRY_TRIALS
from specpipe.run.session import Session
from specpipe.serve.worker import GenerationWorker, Job

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"


@pytest.fixture(scope="module")
def session(smollm2_gguf):
    with initialize(version_base=None, config_path="../specpipe/conf"):
        cfg = compose(config_name="config", overrides=["model=smollm2-135m", "draft=ngram", "budget=auto"])
    return Session(cfg)


def _drain(job: Job, leave_after: int | None = None) -> str:
    """The job's ending; `leave_after`: the client leaves after that many pieces of the answer."""
    pieces = 0
    while True:
        kind, value = job.out.get(timeout=300)
        if kind == "delta":
            pieces += 1
            if leave_after is not None and pieces >= leave_after:
                job.cancelled.set()
        else:
            assert kind == "done", value
            return value.finish_reason


def test_a_second_request_with_a_smaller_max_tokens_starts_a_new_request_in_the_budget(session):
    budget = session.budget
    seen: list[tuple[int, float, int, int]] = []  # (request, pooled rates' weight, probe wait, since probe)
    request = 0
    plan = budget.plan

    def watched_plan(cache_len, room, price=None):  # records the real budget's state as each plan begins
        seen.append((request, sum(budget.rates.first), budget._probe_wait, budget._since_probe))
        return plan(cache_len, room, price=price)

    budget.plan = watched_plan
    worker = GenerationWorker(session, max_waiting=2)
    try:
        first = Job(prompt_ids=session.target.encode_prompt(PROMPT, chat=False), max_tokens=200)
        worker.submit(first)
        assert _drain(first, leave_after=24) == "cancelled"  # it stopped with most of its 200 tokens' room left
        request = 1
        second = Job(prompt_ids=session.target.encode_prompt(PROMPT, chat=False), max_tokens=16)
        worker.submit(second)
        assert _drain(second) in ("length", "stop")
    finally:
        worker.close()
    last_of_first = [s for s in seen if s[0] == 0][-1]
    first_of_second = next(s for s in seen if s[0] == 1)
    assert last_of_first[1] > CARRY_TRIALS, seen  # the first request learned more than a carried prior holds
    # the new request starts from the last one's rates at CARRY_TRIALS' weight, its probe schedule afresh
    assert first_of_second[1] <= CARRY_TRIALS + 1e-9, seen
    assert first_of_second[2:] == (1, 0), seen
