"""draft=suffix's history under a long stream of requests, through a real `specpipe-serve` on 127.0.0.1.

    python scripts/suffix_serve_memory.py --requests 1000 --store-tokens 8000 --max-tokens 4 -- budget=auto

One server with `draft=suffix draft.store_tokens=<--store-tokens>` (the prefix store off), fed `--requests`
greedy chat requests one after another, each a different prompt (a note of `--words` seeded random words and
a question about it), so the history fills, then evicts its least recently used requests. Every `--every`
requests it samples the server's resident memory (VmRSS of its process) and, from `/metrics`, the tokens and
requests the history holds (specpipe_suffix_history_tokens / _sequences). Prints each sample as a JSON line,
then one summary line (JSON): the most tokens the history held against `--store-tokens`, and the resident
memory of the run's second half against the first half's peak (flat: the ratio near 1). Loopback only, each
request bounded by `--timeout`; the server it started is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specpipe.bench.serve_load import one_request, start_server  # noqa: E402

WORDS = (
    "river station ticket morning engine signal harbour bridge window market lantern garden winter copper "
    "orchard valley letter museum kettle ladder compass meadow tunnel island forest pepper candle violin"
).split()
HISTORY_TOKENS, HISTORY_SEQUENCES = "specpipe_suffix_history_tokens", "specpipe_suffix_history_sequences"


def metrics(port: int) -> dict[str, float]:
    """The server's /metrics samples by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        lines = resp.read().decode().splitlines()
    return {n: float(v) for n, v in (line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))}


def rss_mib(pid: int) -> float:
    """A process's resident memory (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def varied_prompt(i: int, words: int) -> str:
    """Request i's own prompt: seeded random words, so no two requests share more than chance n-grams."""
    rng = random.Random(i)
    note = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Note {i}: {note}\nWhich word of the note comes first?"


def sample(pid: int, port: int, done: int, started: float) -> dict:
    figures = metrics(port)
    return {
        "requests": done,
        "seconds": round(time.perf_counter() - started, 1),
        "rss_mib": round(rss_mib(pid), 1),
        "history_tokens": int(figures.get(HISTORY_TOKENS, 0)),
        "history_requests": int(figures.get(HISTORY_SEQUENCES, 0)),
    }


def run(
    overrides: list[str], requests: int, store_tokens: int, max_tokens: int, every: int, words: int, timeout: float
) -> dict:
    # the prefix store off: its KV snapshots would fill their own budget (prefix_cache.bytes) over the same requests
    switches = ["draft=suffix", f"draft.store_tokens={store_tokens}", "prefix_cache.enabled=false"]
    proc, port = start_server([*switches, *overrides], 1)
    samples = []
    try:
        one_request(port, "Say hello.", 2, timeout)  # untimed: allocation, BLAS threads
        started = time.perf_counter()
        samples.append(sample(proc.pid, port, 0, started))
        print(json.dumps(samples[-1]), flush=True)
        for i in range(1, requests + 1):
            one_request(port, varied_prompt(i, words), max_tokens, timeout)
            if i % every == 0 or i == requests:
                samples.append(sample(proc.pid, port, i, started))
                print(json.dumps(samples[-1]), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a request still in flight past uvicorn's graceful shutdown
            proc.kill()
            proc.wait()
    half = len(samples) // 2
    first_peak = max(s["rss_mib"] for s in samples[: half + 1])
    second = [s["rss_mib"] for s in samples[half + 1 :]] or [first_peak]
    result = {
        "requests": requests,
        "store_tokens": store_tokens,
        "history_tokens_max": max(s["history_tokens"] for s in samples),
        "within_store_tokens": all(s["history_tokens"] <= store_tokens for s in samples),
        "rss_first_half_peak_mib": first_peak,
        "rss_second_half_max_mib": max(second),
        "rss_second_half_over_first_peak": round(max(second) / first_peak, 3),
        "seconds": samples[-1]["seconds"],
    }
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--store-tokens", type=int, default=8000, help="draft.store_tokens")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--every", type=int, default=50, help="sample every this many requests")
    ap.add_argument("--words", type=int, default=30, help="words of each request's note (30: about 45 tokens)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take (a loaded machine)")
    ap.add_argument("overrides", nargs="*", help="after --: specpipe-serve overrides (budget=auto, model=...)")
    args = ap.parse_args(argv)
    run(args.overrides, args.requests, args.store_tokens, args.max_tokens, args.every, args.words, args.timeout)


if __name__ == "__main__":
    main()
