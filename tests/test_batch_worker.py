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


def plugins(seed, **sampling):
    return NgramDrafter(min_n=1, max_n=3), GreedyComparator(), GreedyBonus(), True


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
        decoder, BatchBudget(4), max_batch=4, metrics=Metrics(), log_step=steps.append, prefill_per_step=16
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
    solo_first = generate(target, NoneDrafter(), 1, short, 300)[0]
    solo_second = generate(target, NoneDrafter(), 1, long, 20)[0]
    assert done_first.completion_tokens == 300 and done_second.completion_tokens == 20
    assert target.tokenizer.decode(solo_first) == done_first.text
    assert target.tokenizer.decode(solo_second) == done_second.text
    # 200+ prompt tokens at 16 per step: the first row kept stepping alone while the second joined
    batches = [s["batch"] for s in steps]
    joined = batches.index(2, mark)
    assert joined - mark >= (len(long) - 1) // 16 - 2, batches
    assert all({"k", "reason", "batch", "positions", "verify_s"} <= set(s) for s in steps)
