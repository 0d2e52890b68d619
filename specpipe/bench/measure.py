"""One timed generation, as a plain dict ready for the results JSONL.

Contract: `measure_specpipe` drives a Session and keeps its RunStats plus the
per-position acceptance counts and per-token gaps; `measure_mlx_lm` runs
mlx-lm's own `stream_generate` on the same model objects and prompt ids
(greedy), timed the same way (the objects are exactly as mlx-lm built them:
the engine wraps mixers only for the length of its own capturing forwards,
and `measure_mlx_lm` checks that no wrapper is left before timing): decode tok/s = generated tokens / time from
the end of the prefill to the last token, for both systems. Both raise KeyboardInterrupt when Ctrl-C cut
the run short, so a half-measured prompt is never recorded.
"""

from __future__ import annotations

import time

import mlx.core as mx
import msgspec

from specpipe.events import Emitted, RunFinished
from specpipe.metrics import StatsCollector


def measure_specpipe(session, prompt_ids: list[int], max_tokens: int) -> dict:
    """Run `session` once and return its figures.

    Returns:
        RunStats fields (see events.py) plus stop_reason, token_ids,
        e2e_tok_s (generated / wall time including prefill), gaps_ms,
        drafted_at / accepted_at (per draft position counts), emitted_per_step
        (tokens each target forward gave, the prefill's first token included: Spec-Bench's accept_lengths).
    """
    events = list(session.generate(prompt_ids, max_tokens=max_tokens))
    finished = events[-1]
    if not isinstance(finished, RunFinished) or finished.stop_reason == "interrupted":
        raise KeyboardInterrupt
    counts = StatsCollector()  # the run's own statistics, kept as counts so prompts can be summed
    for event in events:
        counts.consume(event)
    record = msgspec.to_builtins(finished.stats)
    s = finished.stats
    record.update(
        stop_reason=finished.stop_reason,
        token_ids=finished.token_ids,
        e2e_tok_s=s.generated_tokens / s.wall_s if s.wall_s else 0.0,
        gaps_ms=[round(1000.0 * g, 3) for g in counts.gaps_s],
        drafted_at=counts.position_drafted,
        accepted_at=counts.position_accepted,
        emitted_per_step=[len(e.token_ids) for e in events if isinstance(e, Emitted) and e.token_ids],
    )
    return record


def measure_mlx_lm(
    model, tokenizer, prompt_ids: list[int], max_tokens: int, draft_model=None, k: int = 0, sampling: dict | None = None
) -> dict:
    """mlx-lm's greedy generation on the given model objects.

    Args:
        model, tokenizer: the target Engine's `.model` and `.tokenizer`.
        prompt_ids: the same ids specpipe was given.
        draft_model: the drafter Engine's `.model` for mlx-lm's speculative
            decoding (None: plain decoding).
        k: mlx-lm's `num_draft_tokens` when `draft_model` is set.
        sampling: temperature/top_p/top_k/min_p for mlx-lm's sampler (None: greedy).

    Returns:
        token_ids (EOS excluded, as specpipe does), generation_tps and
        prompt_tps as mlx-lm reports them, and our own clock's ttft_s,
        wall_s, e2e_tok_s, decode_tok_s, gaps_ms, peak_memory_bytes,
        from_draft (tokens mlx-lm took from the draft).
    """
    from mlx_lm.generate import stream_generate
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    from specpipe.engine.introspect import foreign_modules

    for m in (model, draft_model):
        left = foreign_modules(m) if m is not None else []
        if left:  # would time our code under mlx-lm's name
            raise RuntimeError(f"the mlx-lm anchor would run on a model holding specpipe modules at {', '.join(left)}")
    s = sampling or {}
    sampler = make_sampler(
        temp=s.get("temperature", 0.0), top_p=s.get("top_p", 1.0), min_p=s.get("min_p", 0.0), top_k=s.get("top_k", 0)
    )
    kwargs = {"sampler": sampler}
    if draft_model is not None:
        kwargs.update(draft_model=draft_model, num_draft_tokens=k)
    mx.reset_peak_memory()
    token_ids: list[int] = []
    gaps: list[float] = []
    from_draft = 0
    last: float | None = None
    response = None
    t0 = time.perf_counter()
    # The prompt (all but its last token) goes into mlx-lm's own prompt caches first, so the prefill end is
    # known: timing from the first token instead would leave out a whole speculative step (its tokens all
    # arrive with the first one) and flatter mlx-lm's speculative rate.
    cache = make_prompt_cache(model) + (make_prompt_cache(draft_model) if draft_model is not None else [])
    for m, c in ((model, cache[: len(model.layers)]), (draft_model, cache[len(model.layers) :])):
        if m is not None:
            _prefill(m, c, prompt_ids[:-1])
    prefill_end = time.perf_counter() - t0
    stream = stream_generate(
        model, tokenizer, mx.array(prompt_ids[-1:]), max_tokens=max_tokens, prompt_cache=cache, **kwargs
    )
    for response in stream:
        now = time.perf_counter() - t0
        # The last response repeats the EOS token that ended the run (finish_reason "stop"): not output.
        if response.finish_reason == "stop":
            break
        if last is None:
            ttft = now
        gaps.append(round(1000.0 * (now - (prefill_end if last is None else last)), 3))
        last = now
        token_ids.append(int(response.token))
        from_draft += int(response.from_draft)
    wall = time.perf_counter() - t0
    n = len(token_ids)
    return {
        "token_ids": token_ids,
        "generated_tokens": n,
        "generation_tps": response.generation_tps if response else 0.0,
        "prompt_tps": response.prompt_tps if response else 0.0,
        "ttft_s": ttft if n else 0.0,
        "wall_s": wall,
        "e2e_tok_s": n / wall if wall else 0.0,
        "prefill_s": prefill_end,
        "decode_tok_s": n / (last - prefill_end) if n and last is not None and last > prefill_end else 0.0,
        "gaps_ms": gaps,
        "peak_memory_bytes": int(mx.get_peak_memory()),
        "from_draft": from_draft,
        "num_draft_tokens": k if draft_model is not None else 0,
    }


def _prefill(model, cache: list, ids: list[int], chunk: int = 512) -> None:
    """mlx-lm's own prompt processing (its generate_step prefill), on the given caches."""
    for start in range(0, len(ids), chunk):
        model(mx.array(ids[start : start + chunk], dtype=mx.uint32)[None], cache=cache)
        mx.eval([c.state for c in cache])
