"""Per-step drafting cost of `draft=ngram` at growing context lengths: the
incremental hashed index (specpipe/drafters/ngram.py) vs the per-step rescan
it replaced (tests/test_ngram_index.py::rescan), both over the whole context.

Prints figures, asserts nothing (a shared CPU is noisy: read ratios within one
run). The context is the project's own Python source as byte-level token ids
(deterministic, repetitive like code); one step = append 3 new tokens, then
propose K = 8. Both drafters must propose the same ids (checked). Timed in
two passes: interleaved, the rescan's big arrays evict the index from cache.

    python scripts/ngram_step_cost.py                     # 1k 4k 16k 32k, 200 steps each
    python scripts/ngram_step_cost.py --contexts 1024 16384 --steps 500
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_ngram_index import rescan  # noqa: E402  (the old implementation, kept as the tests' reference)

from specpipe.drafters.ngram import NgramDrafter  # noqa: E402


def source_ids(n: int) -> list[int]:
    text = b"".join(p.read_bytes() for p in sorted((ROOT / "specpipe").rglob("*.py")))
    while len(text) < n:
        text += text
    return list(text[:n])


def per_step_us(context: int, steps: int, k: int = 8, grow: int = 3) -> tuple[float, float]:
    ids = source_ids(context + steps * grow)
    drafter = NgramDrafter(min_n=1, max_n=4, window=None)
    drafter.prefill(ids[:context])
    # two passes, not interleaved: the rescan's whole-context arrays would evict the index from the CPU caches
    new, old, proposals = [], [], []
    seen = ids[:context]  # one list that grows, as the pipeline's context does (no copy per step)
    for i in range(steps):
        end = context + (i + 1) * grow
        seen.extend(ids[end - grow : end])
        t = time.perf_counter()
        proposals.append(drafter.propose(seen, k).token_ids)
        new.append(time.perf_counter() - t)
    for i in range(steps):
        end = context + (i + 1) * grow
        t = time.perf_counter()
        want = rescan(ids, end, k, 1, 4, 10**9)
        old.append(time.perf_counter() - t)
        assert proposals[i] == want, (end, proposals[i], want)
    return 1e6 * statistics.median(new), 1e6 * statistics.median(old)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    print(f"{'context':>8} {'index us/step':>14} {'rescan us/step':>15} {'rescan/index':>13}")
    for context in args.contexts:
        new, old = per_step_us(context, args.steps)
        print(f"{context:>8} {new:>14.1f} {old:>15.1f} {old / new:>12.1f}x")


if __name__ == "__main__":
    main()
