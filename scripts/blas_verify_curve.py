"""T(n)/T(1) of a Qwen2.5-1.5B-shaped stack (4 layers: q, kv, gated MLP) in MLX float32 for one BLAS.

    SPECPIPE_BLAS=openblas python scripts/blas_verify_curve.py
    SPECPIPE_BLAS=mkl python scripts/blas_verify_curve.py

Minimum of 7 timings per n: the shape of the verify cost that decides whether speculation pays.
"""

import time

from specpipe.engine.load.blas import preload_blas

info = preload_blas()
import mlx.core as mx

h, inter, layers = 1536, 8960, 4
ws = [
    (
        mx.random.normal((h, h)) * 0.02,
        mx.random.normal((h, 256)) * 0.02,
        mx.random.normal((h, 2 * inter)) * 0.02,
        mx.random.normal((inter, h)) * 0.02,
    )
    for _ in range(layers)
]
mx.eval(ws)


def fwd(x):
    for q, kv, up, down in ws:
        a = x @ q
        _ = x @ kv  # the K/V projection's cost, as a layer pays it
        g = x @ up
        x = x + (g[:, :inter] * g[:, inter:]) @ down + a
    return x


res = {}
for n in (1, 2, 3, 5, 9, 17, 33):
    x = mx.random.normal((n, h))
    mx.eval(x)
    mx.eval(fwd(x))
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        mx.eval(fwd(x))
        ts.append(time.perf_counter() - t)
    res[n] = min(ts)
print(
    f"{info.name:9} T(1) {res[1] * 1e3:6.1f} ms  "
    + "  ".join(f"T({n})/T(1) {res[n] / res[1]:.2f}" for n in res if n > 1)
)
