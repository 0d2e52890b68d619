"""The batching worker with a prefix store (serve/batch_worker.py `prefix_wait_tokens`), on a tiny random model, no
HTTP: requests that arrive while another with the same long prompt head is still being prefilled wait for it to
join, then take that head from the store, so it is prefilled once; every answer equals its solo draft=none
decoding."""

from __future__ import annotations

import queue

from specpipe.batch.decoder import BatchDecoder
from specpipe.prefix.store import PrefixStore
from specpipe.serve.batch_worker import BatchWorker
from specpipe.serve.prometheus import Metrics
from specpipe.serve.worker import Job
from tests.conftest import tiny
from tests.test_batch_worker import collect, plugins, solo_text


def test_requests_sharing_a_joining_prompt_head_wait_and_reuse_it():
    target = tiny("llama")
    system = target.encode_prompt(" ".join(f"rule{i}" for i in range(80)), chat=False)
    questions = [target.encode_prompt(f" question {q}?", chat=False) for q in ("one", "two", "three")]
    prompts = [system + q for q in questions]
    store = PrefixStore(1 << 30, target.make_cache)
    decoder = BatchDecoder(target, plugins, prefix_store=store)
    decoder.stop_ids = set()
    metrics = Metrics(store)
    worker = BatchWorker(decoder, 4, 8, metrics, prefill_per_step=16, prefix_wait_tokens=32)
    try:
        busy = Job(prompt_ids=target.encode_prompt("Quick zephyrs blow", chat=False), max_tokens=200)
        worker.submit(busy)
        assert busy.out.get(timeout=120)[0] == "delta"  # a row decodes: the others join a chunk per step
        jobs = [Job(prompt_ids=p, max_tokens=12) for p in prompts]
        for job in jobs:  # the first takes steps to join (16 prompt tokens per step); the others arrive meanwhile
            worker.submit(job)
        done = [collect(job)[1] for job in jobs]
        collect(busy)
    finally:
        worker.close()
    for prompt, finished in zip(prompts, done):
        assert finished.text == solo_text(target, prompt, 12)
    # the shared head was prefilled by the first request only: the two others took it (at least) from the store
    reused = [finished.stats["cached_tokens"] for finished in done]
    assert reused[0] == 0 and min(reused[1:]) >= len(system) - 1, reused
    assert metrics.value("specpipe_prefix_cache_tokens_reused_total") == sum(reused)


def test_a_prompt_sharing_only_a_head_with_a_stored_one_is_kept():
    """Two system prompts' requests: the second shares only the chat template's first tokens with the first
    (stored), and must still be stored itself, so a third request with its system prompt reuses it."""
    target = tiny("llama")
    store = PrefixStore(1 << 30, target.make_cache)
    first, second = [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9, 9, 9]
    for ids in (first, second):
        cache = target.make_cache()
        target.prefill(ids, cache)
        assert store.keep(ids, cache)
    assert store.stats.entries == 2
    hit = store.lookup([*second, 7, 7])
    assert hit is not None and hit.tokens == len(second)


def test_a_third_question_after_two_stored_ones_reuses_the_system_prompt():
    """Two requests with one system prompt and different questions stored branch the trie right after the
    system prompt; a third question there found no entry (the walk stopped at the branch node without looking
    below it), so a second burst of new questions prefilled the whole system prompt again. It takes it from
    the store, and its answer equals its solo draft=none decoding."""
    target = tiny("llama")
    system = target.encode_prompt(" ".join(f"rule{i}" for i in range(40)), chat=False)
    questions = [target.encode_prompt(f"{w} does it open?", chat=False) for w in ("When", "How", "Can")]
    assert len({q[0] for q in questions}) == 3  # each question leaves the system prompt with its own token
    store = PrefixStore(1 << 30, target.make_cache)
    decoder = BatchDecoder(target, plugins, prefix_store=store)
    decoder.stop_ids = set()
    worker = BatchWorker(decoder, 4, 8, Metrics(store), prefix_wait_tokens=32)
    try:
        done = []
        for q in questions:  # one after another: the first two are stored when the third comes
            job = Job(prompt_ids=system + q, max_tokens=6)
            worker.submit(job)
            done.append(collect(job)[1])
    finally:
        worker.close()
    assert done[2].stats["cached_tokens"] >= len(system), [d.stats["cached_tokens"] for d in done]
    assert done[2].text == solo_text(target, system + questions[2], 6)


class _OrderedStore(PrefixStore):
    """A prefix store that notes each `keep` in a shared list of what happened, in order."""

    def __init__(self, order: list, *args):
        super().__init__(*args)
        self.order = order

    def keep(self, ids, target_cache, drafter_state=None):
        self.order.append(("keep", tuple(ids)))
        return super().keep(ids, target_cache, drafter_state)


class _OrderedOut(queue.Queue):
    """A job's output queue that notes each piece's tag in the same list."""

    def __init__(self, order: list):
        super().__init__()
        self.order = order

    def put(self, item, block=True, timeout=None):
        self.order.append((item[0], None))
        super().put(item, block, timeout)


def test_a_joining_prompt_is_stored_after_its_first_tokens_are_out():
    """The store's copy of a joining prompt is not on the way to its first token: the worker puts the row's first
    delta before it keeps the prompt (the timeline: first_token, then kept), and a request with the same prompt
    afterwards still takes all but its last token from the store; both answers equal solo draft=none decoding."""
    target = tiny("llama")
    prompt = target.encode_prompt(" ".join(f"rule{i}" for i in range(30)), chat=False)
    order: list = []
    store = _OrderedStore(order, 1 << 30, target.make_cache)
    decoder = BatchDecoder(target, plugins, prefix_store=store)
    decoder.stop_ids = set()
    worker = BatchWorker(decoder, 4, 8, Metrics(store), prefix_wait_tokens=32)
    try:
        first = Job(prompt_ids=prompt, max_tokens=6, out=_OrderedOut(order))
        worker.submit(first)
        _, done = collect(first)
        again = Job(prompt_ids=prompt, max_tokens=6)
        worker.submit(again)
        _, repeated = collect(again)
    finally:
        worker.close()
    assert done.text == repeated.text == solo_text(target, prompt, 6)
    kept = order.index(("keep", tuple(prompt[:-1])))
    assert order.index(("delta", None)) < kept, order
    assert done.stats["timeline"]["first_token"] <= done.stats["timeline"]["kept"]
    assert repeated.stats["cached_tokens"] == len(prompt) - 1
