"""Can a draft model's prefill hide behind the target's decode on this machine?

Times, on the packaged Qwen pair (float32): 4 target decode steps alone, the 0.5B draft's 50-token prefill
alone, and both at once (the prefill on its own MLX CPU stream in a second thread). On 2 cores with 2 OpenBLAS
threads the "at once" time equals the sum: nothing overlaps, so the prefill stays on the decode path
(docs/benchmarks/log/2026-12-05-spec-bench-18.md).

    python scripts/overlap_draft_prefill.py 2     # OpenBLAS threads
"""

from __future__ import annotations

import sys
import threading
import time

from specpipe.engine.load.blas import preload_blas

print(preload_blas("auto", int(sys.argv[1]) if len(sys.argv) > 1 else 2))  # before mlx loads its BLAS

import mlx.core as mx  # noqa: E402

from specpipe.engine.load.loader import load_engine  # noqa: E402

target = load_engine("qwen2.5-coder-1.5b", precision="float32")
draft = load_engine("qwen2.5-coder-0.5b", precision="float32")
PROMPT = list(range(1000, 1050))
target_cache = target.make_cache()
target.prefill(PROMPT, target_cache)


def decode(steps: int) -> None:
    token = mx.array([[5]])
    for _ in range(steps):
        mx.eval(target.model(token, cache=target_cache))


def draft_prefill(own_stream: bool = False) -> None:
    cache = draft.make_cache()
    if not own_stream:
        mx.eval(draft.model(mx.array([PROMPT]), cache=cache))
        return
    with mx.stream(mx.new_stream(mx.cpu)):  # streams belong to the thread that makes them
        mx.eval(draft.model(mx.array([PROMPT]), cache=cache))


decode(2)
draft_prefill()  # warm both
for _ in range(3):
    t0 = time.perf_counter()
    decode(4)
    alone_decode = time.perf_counter() - t0
    t0 = time.perf_counter()
    draft_prefill()
    alone_prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    worker = threading.Thread(target=draft_prefill, args=(True,))
    worker.start()
    decode(4)
    worker.join()
    together = time.perf_counter() - t0
    print(
        f"decode x4 {alone_decode:.3f} s | draft prefill {alone_prefill:.3f} s | "
        f"one after the other {alone_decode + alone_prefill:.3f} s | at once {together:.3f} s"
    )
