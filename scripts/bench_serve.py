"""What speculation is worth under concurrency: the real `specpipe-serve` driven by the `openai` client.

    python scripts/bench_serve.py --concurrency 1 2 4 8 --requests-per-client 2 --max-tokens 128 \\
        --variants off=draft=none on=draft=ngram,budget.k=8 auto=draft=ngram,budget=auto --out serve_bench.jsonl

Starts one server per variant (same model, 127.0.0.1, port 0), then for each concurrency level
and repeat runs the variants one after the other (A/B interleaved, so a busy machine slows
them alike). Each level sends clients x requests streaming greedy chat requests (prompts of the
code suite, cycled) and records aggregate tok/s, per-request TTFT, inter-chunk latency p50 /
p95 / p99 (a chunk is one step's tokens), acceptance, and whether every answer equals the
`off` variant's answer for the same prompt (batched losslessness). One JSON line per
(variant, concurrency, repeat); a table at the end with each variant's speed-up over `off`.
Bounded: `--timeout` seconds per level; loopback only.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI

SUITE = Path(__file__).resolve().parent.parent / "specpipe" / "bench" / "suites" / "code.jsonl"


def start_server(overrides: list[str], max_batch: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "specpipe.serve.cli", "port=0", f"max_batch={max_batch}", "max_queue=64", *overrides],
        stderr=subprocess.PIPE,
        text=True,
    )
    while True:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit(f"bench_serve: the server with {overrides} did not start")
        print(line.rstrip(), file=sys.stderr)
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if match:
            return proc, f"http://127.0.0.1:{match.group(1)}/v1"


def one_request(client: OpenAI, prompt: str, max_tokens: int) -> dict:
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model="specpipe",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    text, arrivals, figures, tokens = [], [], {}, 0
    for chunk in stream:
        extra = chunk.model_extra or {}
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
            arrivals.append(time.perf_counter())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
            figures = extra.get("specpipe", {})
    ended = time.perf_counter()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {
        "prompt": prompt,
        "text": "".join(text),
        "tokens": tokens,
        "ttft_s": arrivals[0] - started if arrivals else None,
        "latency_s": ended - started,
        "gaps": gaps,
        "drafted": figures.get("drafted", 0),
        "accepted": figures.get("accepted", 0),
        "queue_s": figures.get("queue_s", 0.0),
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def run_level(base: str, prompts: list[str], clients: int, per_client: int, max_tokens: int, timeout: float) -> dict:
    client = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=timeout)
    work = [prompts[i % len(prompts)] for i in range(clients * per_client)]
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda p: one_request(client, p, max_tokens), work))
    wall = time.perf_counter() - started
    gaps = [g for r in results for g in r["gaps"]]
    drafted, accepted = sum(r["drafted"] for r in results), sum(r["accepted"] for r in results)
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
    return {
        "clients": clients,
        "requests": len(results),
        "tokens": sum(r["tokens"] for r in results),
        "wall_s": wall,
        "tok_s": sum(r["tokens"] for r in results) / wall,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_s": percentile(gaps, 50),
        "itl_p95_s": percentile(gaps, 95),
        "itl_p99_s": percentile(gaps, 99),
        "tpot_s": statistics.mean(
            (r["latency_s"] - r["ttft_s"]) / max(r["tokens"] - 1, 1) for r in results if r["ttft_s"]
        ),
        "acceptance": accepted / drafted if drafted else 0.0,
        "drafted": drafted,
        "accepted": accepted,
        "gaps_s": [round(g, 5) for g in gaps],  # every inter-chunk gap: the report's latency CDF
        "answers": {r["prompt"]: r["text"] for r in results},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["off=draft=none", "on=draft=ngram,budget.k=8", "auto=draft=ngram,budget=auto"],
        help="name=override,override,... ; the first is the baseline",
    )
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default="serve_bench.jsonl")
    args = ap.parse_args()
    prompts = [json.loads(line)["prompt"] for line in SUITE.read_text().splitlines() if line.strip()]
    variants = [(v.split("=", 1)[0], v.split("=", 1)[1].split(",")) for v in args.variants]
    servers = {name: start_server([f"model={args.model}", *ov], max(args.concurrency)) for name, ov in variants}
    rows = []
    try:
        with open(args.out, "w") as out:
            for repeat in range(args.repeats):
                for clients in args.concurrency:
                    baseline = None
                    order = variants if repeat % 2 == 0 else variants[::-1]  # alternate who goes first
                    level = {}
                    for name, _ in order:
                        level[name] = run_level(
                            servers[name][1], prompts, clients, args.requests_per_client, args.max_tokens, args.timeout
                        )
                    baseline = level[variants[0][0]]["answers"]
                    for name, _ in variants:
                        r = level[name]
                        r["lossless"] = all(baseline.get(p) == t for p, t in r.pop("answers").items())
                        record = {"variant": name, "repeat": repeat, "model": args.model, **r}
                        rows.append(record)
                        out.write(json.dumps(record) + "\n")
                        out.flush()
                        print(
                            f"{name:>5} c={clients}: {r['tok_s']:7.1f} tok/s  ttft p50 {r['ttft_p50_s']:.3f}s  "
                            f"itl p50/p95/p99 {r['itl_p50_s']:.3f}/{r['itl_p95_s']:.3f}/{r['itl_p99_s']:.3f}s  "
                            f"acc {r['acceptance']:.2f}  lossless {r['lossless']}",
                            flush=True,
                        )
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    print_table(rows, variants[0][0], [n for n, _ in variants])


def print_table(rows: list[dict], base: str, names: list[str]) -> None:
    print(
        "\n| concurrency | "
        + " | ".join(f"{n} tok/s" for n in names)
        + " | "
        + " | ".join(f"{n} / {base}" for n in names[1:])
        + " | "
        + " | ".join(f"{n} ITL p99" for n in names)
        + " |"
    )
    print("|---" * (1 + 2 * len(names) + len(names) - 1) + "|")
    for c in sorted({r["clients"] for r in rows}):
        tok = {n: statistics.median(r["tok_s"] for r in rows if r["clients"] == c and r["variant"] == n) for n in names}
        p99 = {
            n: statistics.median(r["itl_p99_s"] for r in rows if r["clients"] == c and r["variant"] == n) for n in names
        }
        print(
            f"| {c} | "
            + " | ".join(f"{tok[n]:.1f}" for n in names)
            + " | "
            + " | ".join(f"{tok[n] / tok[base]:.2f}x" for n in names[1:])
            + " | "
            + " | ".join(f"{p99[n] * 1000:.0f} ms" for n in names)
            + " |"
        )


if __name__ == "__main__":
    main()
