"""Holes vs re-alignment by copy: what one step's per-row shift of the whole KV costs next to the forward
(SmolLM2, B = 8, n = 9).

python scripts/batch_realign_cost.py
"""

import time

from specpipe.cli import _preload_blas

_preload_blas()
import mlx.core as mx
import numpy as np

from specpipe.batch.cache import RaggedBatch
from specpipe.engine.load.loader import load_engine

t = load_engine("smollm2-135m", None, "float32")
for L in (256, 1024):
    prompt = [i % 200 + 10 for i in range(L + 1)]
    solo = t.make_cache()
    t.prefill(prompt[:-1], solo)
    B, n = 8, 9
    rb = RaggedBatch(len(solo))
    for _ in range(B):
        rb.add(solo)
    ids = mx.array(np.full((B, n), 42, dtype=np.uint32))
    fw, cp = [], []
    shifts = mx.array(np.random.randint(0, 8, size=B))
    for _ in range(6):
        t0 = time.perf_counter()
        out = t.model(ids, cache=rb.layers)
        mx.eval(out, [layer.state for layer in rb.layers])
        fw.append(time.perf_counter() - t0)
        # re-alignment: every row's columns shifted right by its rejected count (a gather over the whole buffer)
        idx = (mx.arange(rb.idx + n)[None, :] - shifts[:, None]) % (rb.idx + n)
        t0 = time.perf_counter()
        moved = [
            mx.take_along_axis(layer.keys[..., : rb.idx + n, :], idx[:, None, :, None], axis=2) for layer in rb.layers
        ] + [
            mx.take_along_axis(layer.values[..., : rb.idx + n, :], idx[:, None, :, None], axis=2) for layer in rb.layers
        ]
        mx.eval(moved)
        cp.append(time.perf_counter() - t0)
    print(
        f"context {L}, B={B}, n={n}: forward {min(fw) * 1000:.1f} ms, "
        f"per-step re-alignment copy {min(cp) * 1000:.1f} ms ({min(cp) / min(fw):.2f}x of the forward)"
    )
