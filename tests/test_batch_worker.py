"""The batching worker thread (specpipe/serve/batch_worker.py) on a tiny random model, no HTTP:
a long prompt joins over several steps while another request keeps decoding, both answers equal
their solo draft=none decoding, and each step's budget decision is logged."""

from __future__ import annotations

from specpipe.batch.decoder import BatchDecoder, RowPlugins
from specpipe.budgets.fixed import FixedBudget
from specpipe.core.stages.bonus import GreedyBonus
from specpipe.core.stages.compare import GreedyComparator
from specpipe.drafters.ngram import NgramDrafter
from specpipe.drafters.none import NoneDrafter
from specpipe.serve.batch_worker import BatchWorker
from specpipe.serve.prometheus import Metrics
from specpipe.serve.worker import Job
from tests.conftest import generate, tiny


def plugins(seed, **sampling):
    return RowPlugins(NgramDrafter(min_n=1, max_n=3), GreedyComparator(), GreedyBonus(), budget=FixedBudget(4))


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


def test_auto_rows_log_each_decision_and_stay_exact(tmp_path, monkeypatch):
    """budget=auto per row in the worker: each row's own budget plans its K (n-gram rows look back on
    plain steps), every step logs each row's K and reason, and every answer equals its solo draft=none
    decoding."""
    from specpipe.budgets.auto import AutoBudget

    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path))  # the device curve is timed into a fresh cache
    target = tiny("llama")
    texts = ["the cat sat on the mat, the cat sat on the", "def f(x):\n    return x + 1\n\ndef g(x):\n    return"]
    prompts = [target.encode_prompt(t, chat=False) for t in texts]
    budgets = []

    def auto_plugins(seed, **sampling):
        drafter, budget = NgramDrafter(min_n=1, max_n=3), AutoBudget(k_max=8, quick=True)
        budget.prepare(target, drafter)
        budgets.append(budget)
        return RowPlugins(drafter, GreedyComparator(), GreedyBonus(), budget=budget)

    steps: list[dict] = []
    decoder = BatchDecoder(target, auto_plugins)
    decoder.stop_ids = set()
    worker = BatchWorker(decoder, max_batch=2, max_waiting=2, log_step=steps.append)
    try:
        jobs = [Job(prompt_ids=p, max_tokens=40) for p in prompts]
        for job in jobs:
            worker.submit(job)
        done = [collect(job)[1] for job in jobs]
    finally:
        worker.close()
    for prompt, finished in zip(prompts, done):
        assert finished.completion_tokens == 40 and finished.text == solo_text(target, prompt, 40)
    assert len(budgets) == 2 and budgets[0] is not budgets[1]  # one budget per row
    assert all({"k", "reason", "batch", "rows", "positions", "verify_s"} <= set(s) for s in steps)
    assert all(len(s["rows"]) == s["batch"] and all("reason" in r for r in s["rows"]) for s in steps)
    assert {r["reason"] for s in steps for r in s["rows"]} - {"first token"}  # the budgets planned, not only overrides
