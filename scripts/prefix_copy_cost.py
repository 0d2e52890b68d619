"""What a prefix-store hit costs against the prefill it saves (docs/prefix_cache.md's figures).

Prints figures, asserts nothing (a shared CPU is noisy: compare ratios within one run). For a prompt of
`--tokens` ids on the packaged SmolLM2 (float32): the prefill of all but its last token, `keep` (the snapshot
copy), `lookup` (the restore copy into a fresh cache), and a batch `join` of the restored cache (the copy into
a RaggedBatch every row pays anyway), interleaved over `--reps` rounds, medians.

    python scripts/prefix_copy_cost.py                      # 1400 tokens, 5 rounds
    python scripts/prefix_copy_cost.py --tokens 64 --reps 1 --model tiny-random
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

try:
    from specpipe.engine.load.blas import preload_blas

    preload_blas()
except ImportError:  # pragma: no cover
    pass

import mlx.core as mx

from specpipe.batch.cache import RaggedBatch
from specpipe.engine.device import device
from specpipe.engine.load.loader import load_engine
from specpipe.prefix.store import PrefixStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1400)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    engine = load_engine(args.model, precision="float32", **({"arch": "llama"} if args.model == "tiny-random" else {}))
    vocab = engine.model.args.vocab_size
    ids = [(37 * i + 11) % vocab for i in range(args.tokens)]
    held = ids[:-1]
    times: dict[str, list[float]] = {"prefill": [], "keep": [], "lookup": [], "join": []}
    for _ in range(args.reps):
        store = PrefixStore(1 << 34, engine.make_cache)
        cache = engine.make_cache()
        s = time.perf_counter()
        engine.prefill(held, cache)
        mx.eval([c.state for c in cache])
        times["prefill"].append(time.perf_counter() - s)
        s = time.perf_counter()
        store.keep(held, cache)
        times["keep"].append(time.perf_counter() - s)
        s = time.perf_counter()
        hit = store.lookup(ids)
        assert hit is not None and hit.tokens == len(held)
        mx.eval([c.state for c in hit.cache])
        times["lookup"].append(time.perf_counter() - s)
        batch = RaggedBatch(len(hit.cache))
        s = time.perf_counter()
        batch.add(hit.cache, length=len(held))
        mx.eval([layer.keys for layer in batch.layers if layer.keys is not None])
        times["join"].append(time.perf_counter() - s)
    info = device()
    print(
        f"# {args.model}, {len(held)} positions, {store.stats.bytes_held / 2**20:.1f} MiB snapshot; "
        f"{info.get('cpu', '')} {info.get('blas', '')}",
        file=sys.stderr,
    )
    prefill = statistics.median(times["prefill"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:8s} {median * 1000:9.2f} ms  ({median / prefill:.4f} of the prefill)")


if __name__ == "__main__":
    main()
