"""Concurrency against a running `specpipe-serve` on 127.0.0.1: C clients, N requests each.

    python scripts/load_serve.py --port 8000 --clients 1 2 4 --requests 3 --max-tokens 64

For each client count prints aggregate tokens/s, request latency p50 / p99 and the server's own
figures (time queued, acceptance). Bounded: clients x requests requests per level, 600 s each.
The server decodes one request at a time, so latency grows with the queue while throughput stays
that of batch 1: the baseline that batched speculative decoding has to beat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PROMPTS = [
    "Rename the variable `items` to `values`:\n\ndef total(items):\n    return sum(item for item in items)",
    "Write a Python function that reverses a string, with a docstring.",
    "Explain in two sentences what a hash map is.",
]


def one(base: str, prompt: str, max_tokens: int) -> dict:
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        answer = json.loads(resp.read())
    return {
        "latency_s": time.perf_counter() - started,
        "tokens": answer["usage"]["completion_tokens"],
        **answer["specpipe"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--requests", type=int, default=3, help="per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    for c in args.clients:
        jobs = [PROMPTS[i % len(PROMPTS)] for i in range(c * args.requests)]
        started = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            runs = list(pool.map(lambda p: one(base, p, args.max_tokens), jobs))
        wall = time.perf_counter() - started
        lat = sorted(r["latency_s"] for r in runs)
        p99 = lat[min(len(lat) - 1, round(0.99 * len(lat)) - 1)]
        print(
            f"clients {c:2d}: {sum(r['tokens'] for r in runs) / wall:6.1f} tok/s aggregate | latency p50 "
            f"{statistics.median(lat):6.2f} s p99 {p99:6.2f} s "
            f"| queued p50 {statistics.median(r['queue_s'] for r in runs):5.2f} s"
            f" | acceptance {statistics.mean(r['acceptance_rate'] for r in runs):.0%}"
        )


if __name__ == "__main__":
    main()
