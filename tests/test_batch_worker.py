"""The batching worker thread (specpipe/serve/batch_worker.py) on a tiny random model, no HTTP:
a long prompt joins over several steps while another request keeps decoding, both answers equal
their solo draft=none decoding, and each step's budget decision is logged."""

from __future__ import annotations

from specpipe.batch.budget import BatchBudget
from specpipe.batch.decoder import BatchDecoder
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.drafters.ngram import NgramDrafter
from specpipe.drafters.none import NoneDrafter
from specpipe.serve.batch_worker import BatchWorker
from specpipe.serve.prometheus import Metrics
from specpipe.serve.worker import Job
from tests.conftest import generate, tiny
from tests.test_batch import auto


def plugins(seed, **sampling):
    return NgramDrafter(min_n=1, max_n=3), GreedyComparator(), GreedyBonus(), True


def solo_text(target, prompt_ids: list[int], max_tokens: int) -> str:
    """The prompt decoded alone with draft=none, as the streaming detokenizer the worker uses writes it."""
    detok = target.tokenizer.detokenizer
    detok.reset()
    for token in generate(target, NoneDrafter(), 1, prompt_ids, max_tokens)[0]:
        detok.add_token(token)
    detok.finalize()
    return detok.text


def collect(job: Job, timeout: float = 120) -> tuple[list, object]:
    pieces = []
    while True:
        tag, value = job.out.get(timeout=timeout)
        if tag != "delta":
            assert tag == "done", value
            return pieces, value
        pieces.append(value)


def test_a_long_prompt_joins_over_several_steps_while_another_row_decodes():
    target = tiny("llama")
    short = target.encode_prompt("Quick zephyrs blow, vexing daft Jim", chat=False)
    long = target.encode_prompt(" ".join(f"word{i}" for i in range(120)), chat=False)
    assert len(long) > 200
    steps: list[dict] = []
    decoder = BatchDecoder(target, plugins)
    decoder.stop_ids = set()
    worker = BatchWorker(
        decoder,
        BatchBudget(4),
        max_batch=4,
        max_waiting=4,
        metrics=Metrics(),
        log_step=steps.append,
        prefill_per_step=16,
    )
    try:
        first = Job(prompt_ids=short, max_tokens=300)
        worker.submit(first)
        assert first.out.get(timeout=120)[0] == "delta"  # decoding has started
        second = Job(prompt_ids=long, max_tokens=20)
        mark = len(steps)
        worker.submit(second)
        _, done_first = collect(first)
        _, done_second = collect(second)
    finally:
        worker.close()
    assert done_first.completion_tokens == 300 and done_second.completion_tokens == 20
    assert done_first.text == solo_text(target, short, 300)
    assert done_second.text == solo_text(target, long, 20)
    # 200+ prompt tokens at 16 per step: the first row kept stepping alone while the second joined
    batches = [s["batch"] for s in steps]
    joined = batches.index(2, mark)
    assert joined - mark >= (len(long) - 1) // 16 - 2, batches
    assert all({"k", "reason", "batch", "positions", "verify_s"} <= set(s) for s in steps)


def test_auto_batches_log_each_decision_and_stay_exact():
    """budget=auto's batch form in the worker: n-gram rows look back on plain steps, every step's
    K and reason is logged, and every answer equals its solo draft=none decoding."""
    import numpy as np

    from specpipe.batch.costs import CostTable

    target = tiny("llama")
    texts = ["the cat sat on the mat, the cat sat on the", "def f(x):\n    return x + 1\n\ndef g(x):\n    return"]
    prompts = [target.encode_prompt(t, chat=False) for t in texts]
    costs = CostTable([1, 2], [1, 2, 9], np.array([[1.0, 1.05, 1.5], [1.2, 1.3, 2.0]]))  # drafting is cheap
    budget = auto(8, costs, hindsight=True)
    steps: list[dict] = []
    decoder = BatchDecoder(target, plugins)
    decoder.stop_ids = set()
    worker = BatchWorker(decoder, budget, max_batch=2, max_waiting=2, log_step=steps.append)
    try:
        jobs = [Job(prompt_ids=p, max_tokens=40) for p in prompts]
        for job in jobs:
            worker.submit(job)
        done = [collect(job)[1] for job in jobs]
    finally:
        worker.close()
    for prompt, finished in zip(prompts, done):
        assert finished.completion_tokens == 40 and finished.text == solo_text(target, prompt, 40)
    assert {s["reason"] for s in steps} <= {"plain", "cost"} and all(
        "alpha" in s and "continuation" in s for s in steps
    )
    assert any(s["k"] > 0 for s in steps)
