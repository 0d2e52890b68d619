"""The prefix store under load, through real `specpipe-serve` processes on 127.0.0.1 and real HTTP clients.

    python scripts/prefix_serve.py shared --clients 8 --repeats 3 --max-tokens 16 -- draft=ngram budget.k=8
    python scripts/prefix_serve.py memory --requests 300 --bytes 33554432 --max-tokens 4 -- draft=ngram budget.k=8

`shared`: two servers, the store on and off (max_batch = clients); per repeat and server (order alternating),
a cold burst: `--clients` streamed greedy chat requests at once, each the conversations suite's ~1k-token support
system prompt (bench/conversations.py; a repeat's own first line, so no repeat reuses another's) and its own
question; then a warm burst: as many new questions with the same system prompt, which the store-on server now
holds (a server that has served that system prompt before). Prints per burst the median time to first token
(client clock), the prompt tokens the store gave and the ones prefilled, and from `/metrics` before and after the
store's tokens reused; then the off / on ratio of the medians, cold and warm apart. Every answer is checked equal
between the two servers.
`memory`: one server with the store on and `prefix_cache.bytes` small; `--requests` requests in turn, each a
different prefix (a note of `--words` seeded random words: 110 is about 150 tokens), the server's resident
memory (VmRSS) sampled every `--every` requests with the store's bytes, entries and evictions. Prints the
samples and one summary line (JSON): the resident memory of the second half against the first half's peak.
Loopback only, each request bounded by `--timeout`; the servers it started are stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specpipe.bench.chat_client import stream_chat  # noqa: E402
from specpipe.bench.conversations import SYSTEM_QUESTIONS, support_system_prompt  # noqa: E402
from specpipe.bench.serve_load import start_server  # noqa: E402

STORE_ON, STORE_OFF = "prefix_cache.enabled=true", "prefix_cache.enabled=false"
WORDS = (
    "river station ticket morning engine signal harbour bridge window market lantern garden winter copper "
    "orchard valley letter museum kettle ladder compass meadow tunnel island forest pepper candle violin"
).split()


def metrics(port: int) -> dict[str, float]:
    """The server's /metrics samples by name (labels kept in the name)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _stop(servers: dict) -> None:
    for proc, _ in servers.values():
        proc.terminate()
        proc.wait(timeout=60)


# ---------------------------------------------------------------- many clients, one system prompt


def shared(overrides: list[str], clients: int, repeats: int, max_tokens: int, timeout: float, log=print) -> dict:
    """Bursts of `clients` requests sharing one system prompt, the store on and off; returns the figures."""
    servers = {}
    try:
        for name, switch in (("on", STORE_ON), ("off", STORE_OFF)):
            servers[name] = start_server([*overrides, switch], clients)
        for _, port in servers.values():  # untimed: allocation, BLAS threads
            stream_chat(port, [{"role": "user", "content": "Say hello."}], 2, timeout)
        bursts = []
        for r in range(repeats):
            system = f"Support desk, shift {r + 1}.\n{support_system_prompt()}"
            questions = [SYSTEM_QUESTIONS[i % len(SYSTEM_QUESTIONS)] for i in range(clients)]
            for phase, lead in (("cold", ""), ("warm", "A second customer writes: ")):
                asks = [
                    [{"role": "system", "content": system}, {"role": "user", "content": lead + q}] for q in questions
                ]
                answers = {}
                for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                    burst = _burst(servers[name][1], asks, max_tokens, timeout)
                    answers[name] = burst.pop("texts")
                    bursts.append({"store": name, "repeat": r, "burst": phase, **burst})
                    log(json.dumps({k: v for k, v in bursts[-1].items() if k != "ttft_s"}))
                if answers["on"] != answers["off"]:
                    log(f"repeat {r} {phase}: ANSWERS DIFFER between the store on and off")
                    bursts[-1]["answers_equal"] = False
    finally:
        _stop(servers)
    result: dict = {"clients": clients, "repeats": repeats}
    for phase in ("cold", "warm"):
        med = {
            n: statistics.median(b["ttft_median_s"] for b in bursts if b["store"] == n and b["burst"] == phase)
            for n in ("on", "off")
        }
        result[f"{phase}_ttft_median_on_s"] = round(med["on"], 3)
        result[f"{phase}_ttft_median_off_s"] = round(med["off"], 3)
        result[f"{phase}_off_over_on"] = round(med["off"] / med["on"], 2) if med["on"] else None
    result["answers_equal"] = all(b.get("answers_equal", True) for b in bursts)
    result["bursts"] = bursts
    log(json.dumps({k: v for k, v in result.items() if k != "bursts"}))
    return result


def _burst(port: int, asks: list, max_tokens: int, timeout: float) -> dict:
    """One burst of requests at once; its figures, and the answers' texts (`texts`)."""
    before = metrics(port)
    with ThreadPoolExecutor(len(asks)) as pool:
        got = list(pool.map(lambda m: stream_chat(port, m, max_tokens, timeout), asks))
    after = metrics(port)
    reused = sum(g["cached_tokens"] or 0 for g in got)
    prompt = sum(g["prompt_tokens"] for g in got)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return {
        "ttft_median_s": statistics.median(g["ttft_s"] for g in got),
        "ttft_s": [round(g["ttft_s"], 3) for g in got],
        "prompt_tokens": prompt,
        "reused_tokens": reused,
        "prefilled_tokens": prompt - reused,
        # the store's own count (none with the store off); `prefilled_tokens` says what the burst prefilled
        "metrics_reused": delta.get("specpipe_prefix_cache_tokens_reused_total"),
        "texts": [g["text"] for g in got],
    }


# ---------------------------------------------------------------- many prefixes, a small store


def varied_prompt(i: int, words: int = 110) -> str:
    """Request i's own text: a numbered note of seeded random words, so no two share more than a few tokens."""
    rng = random.Random(i)
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Note {i} ({rng.randrange(10**6)}): {body}\nSummarise the note in one sentence."


def memory(
    overrides: list[str],
    requests: int,
    store_bytes: int,
    max_tokens: int,
    every: int,
    timeout: float,
    log=print,
    words: int = 110,
) -> dict:
    """`requests` requests with varied prefixes against a store of `store_bytes`; resident memory over them."""
    servers = {}
    try:
        servers["on"] = start_server([*overrides, STORE_ON, f"prefix_cache.bytes={store_bytes}"], 1)
        proc, port = servers["on"]
        samples = []
        started = time.perf_counter()
        for i in range(requests):
            stream_chat(port, [{"role": "user", "content": varied_prompt(i, words)}], max_tokens, timeout)
            if (i + 1) % every == 0 or i == 0:
                m = metrics(port)
                sample = {
                    "requests": i + 1,
                    "rss_mib": round(rss_mib(proc.pid), 1),
                    "store_bytes": m.get("specpipe_prefix_cache_bytes", 0.0),
                    "entries": m.get("specpipe_prefix_cache_entries", 0.0),
                    "evictions": m.get("specpipe_prefix_cache_evictions_total", 0.0),
                    "elapsed_s": round(time.perf_counter() - started, 1),
                }
                samples.append(sample)
                log(json.dumps(sample))
    finally:
        _stop(servers)
    half = [s["rss_mib"] for s in samples if s["requests"] <= requests // 2] or [samples[0]["rss_mib"]]
    late = [s["rss_mib"] for s in samples if s["requests"] > requests // 2] or [samples[-1]["rss_mib"]]
    result = {
        "requests": requests,
        "prefix_cache_bytes": store_bytes,
        "rss_mib_first_half_peak": max(half),
        "rss_mib_second_half_peak": max(late),
        "rss_mib_last": samples[-1]["rss_mib"],
        "store_bytes_max": max(s["store_bytes"] for s in samples),
        "evictions": samples[-1]["evictions"],
        "samples": samples,
    }
    log(json.dumps({k: v for k, v in result.items() if k != "samples"}))
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sitting", choices=("shared", "memory"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--bytes", type=int, default=32 << 20, help="memory: prefix_cache.bytes")
    ap.add_argument("--every", type=int, default=10, help="memory: sample every this many requests")
    ap.add_argument("--words", type=int, default=110, help="memory: words of each request's varied note")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per request")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.overrides = argv[cut + 1 :]  # config overrides for specpipe-serve
    if min(args.clients, args.repeats, args.requests, args.every, args.max_tokens) < 1 or args.bytes < 0:
        print("prefix_serve.py: error: counts must be at least 1 and --bytes 0 or more", file=sys.stderr)
        raise SystemExit(2)
    if args.sitting == "shared":
        shared(args.overrides, args.clients, args.repeats, args.max_tokens, args.timeout)
    else:
        memory(args.overrides, args.requests, args.bytes, args.max_tokens, args.every, args.timeout, words=args.words)


if __name__ == "__main__":
    main()
