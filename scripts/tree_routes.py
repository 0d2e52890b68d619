"""T(n) of verifying n draft nodes on this CPU, two routes, SmolLM2 float32 with the BLAS specpipe preloads.

    python scripts/tree_routes.py [--prefix 256] [--repeats 7] [--model smollm2-135m]

(a) tree: one forward of [root, n nodes] with a tree mask and per-node RoPE positions (specpipe/trees/forward.py);
(b) rows: B = n / d batch rows of [root, d tokens] over the prefix KV copied per row (plain causal mask);
chain: one causal forward of n + 1 tokens (today's verify), for reference. Interleaved per repeat, minimum of the
repeats, each over a fresh copy of the same prefix cache: ratios are to T(1), one token after the same prefix.
"""

import argparse
import time

from specpipe.engine.load.blas import preload_blas

blas = preload_blas()
import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import KVCache  # noqa: E402

from specpipe.engine.load.loader import load_engine  # noqa: E402
from specpipe.trees.forward import tree_forward  # noqa: E402
from specpipe.trees.tree import TokenTree  # noqa: E402


def copy_cache(cache, rows=1):
    out = []
    for c in cache:
        k, v = c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
        n = KVCache()
        n.update_and_fetch(
            mx.repeat(k, rows, axis=0) if rows > 1 else mx.array(k),
            mx.repeat(v, rows, axis=0) if rows > 1 else mx.array(v),
        )
        out.append(n)
    mx.eval([(c.keys, c.values) for c in out])
    return out


def timed(fn):
    t = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--depth", type=int, default=4, help="route (b): tokens per batch row")
    a = ap.parse_args()
    e = load_engine(a.model, precision="float32")
    prefix = [(i * 7919) % 30000 + 100 for i in range(a.prefix)]
    base = e.make_cache()
    e.prefill(prefix, base)
    model = e.model
    ns = [4, 8, 16, 32, 64]

    def one():
        c = copy_cache(base)
        return lambda: model(mx.array([[1]]), cache=c)

    def chain(n):
        c = copy_cache(base)
        return lambda: model(mx.array([list(range(2, n + 3))]), cache=c)

    def tree(n):
        c = copy_cache(base)
        t = TokenTree()
        for i in range(n):  # a bushy tree: 4 children per node, breadth first
            t.add(100 + i, (i - 4) // 4 if i >= 4 else -1)
        return lambda: tree_forward(e, c, 1, t).logits

    def rows(n):
        b = max(1, n // a.depth)
        c = copy_cache(base, rows=b)  # the per-row prefix copy is part of this route's cost
        ids = mx.array([[1] + list(range(2, a.depth + 2))] * b)
        return lambda: model(ids, cache=c)

    def rows_with_copy(n):
        b = max(1, n // a.depth)
        ids = mx.array([[1] + list(range(2, a.depth + 2))] * b)

        def run():
            c = copy_cache(base, rows=b)
            return model(ids, cache=c)

        return run

    for _ in range(2):  # warm up every shape
        for n in ns:
            for f in (chain, tree, rows):
                timed(f(n))
    best = {}
    for _ in range(a.repeats):
        best.setdefault("one", []).append(timed(one()))
        for n in ns:
            for label, f in (("chain", chain), ("tree", tree), ("rows", rows), ("rows+copy", rows_with_copy)):
                best.setdefault((label, n), []).append(timed(f(n)))
    t1 = min(best["one"])
    print(f"{a.model} float32, {blas.name}, prefix {a.prefix}, min of {a.repeats}; T(1) = {t1 * 1e3:.1f} ms")
    print(
        f"n nodes | chain n+1 causal | (a) tree mask + RoPE by depth | (b) rows x d={a.depth} (prefix copied) "
        "| (b) incl. copy"
    )
    for n in ns:
        r = [min(best[(lab, n)]) / t1 for lab in ("chain", "tree", "rows", "rows+copy")]
        print(f"{n:7d} | {r[0]:16.2f} | {r[1]:29.2f} | {r[2]:31.2f} | {r[3]:.2f}")


if __name__ == "__main__":
    main()
