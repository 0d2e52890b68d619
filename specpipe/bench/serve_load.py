"""`specpipe-bench-serve`: what speculation is worth under concurrency, measured on real `specpipe-serve` servers.

Contract: starts one server per variant (same model, 127.0.0.1, port 0), then for each repeat and
concurrency level runs the variants one after the other (order alternating per repeat, so a busy
machine slows them alike). A level sends clients x requests streaming greedy chat requests (the
suite's prompts, cycled) and writes one JSON line per (variant, level, repeat) to `--out`: aggregate
tok/s, TTFT and inter-chunk p50 / p95 / p99 (a chunk is one step's tokens), acceptance, and `lossless`
(every answer equals the first variant's answer for the same prompt). A table follows on stdout;
`specpipe-bench-report FILE` draws the plots. Loopback only; each level is bounded by `--timeout`.

    specpipe-bench-serve --concurrency 1 2 4 8 --requests-per-client 4 --max-tokens 64 --repeats 3 \\
        --variants off=draft=none on=draft=ngram,budget.k=8 auto=draft=ngram,budget=auto
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TOOL = "specpipe-bench-serve"


class LoadError(Exception):
    """A bad argument or a server that would not start: one line for the user."""


# ---------------------------------------------------------------- servers and requests


def start_server(overrides: list[str], max_batch: int) -> tuple[subprocess.Popen, int]:
    """A `specpipe-serve` child on a free port; returns it and its port once it says where it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specpipe.serve.cli", "port=0", f"max_batch={max_batch}", "max_queue=64", *overrides],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    last = ""
    while line := proc.stderr.readline():
        print(line.rstrip(), file=sys.stderr)
        last = line.strip() or last
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if match:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, int(match.group(1))
    proc.wait()
    raise LoadError(f"the server with {' '.join(overrides)} did not start: {last}")


def one_request(port: int, prompt: str, max_tokens: int, timeout: float) -> dict:
    """One streaming greedy chat request; its text, token count, chunk arrival gaps and draft figures."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise LoadError(f"the server answered {resp.status}: {resp.read().decode()[:200]}")
    text: list[str] = []
    arrivals: list[float] = []
    figures: dict = {}
    tokens = 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        delta = (event.get("choices") or [{}])[0].get("delta", {}).get("content")
        if delta:
            text.append(delta)
            arrivals.append(time.perf_counter())
        if event.get("usage"):
            tokens = event["usage"].get("completion_tokens", tokens)
        figures = event.get("specpipe") or figures
    conn.close()
    ended = time.perf_counter()
    return {
        "prompt": prompt,
        "text": "".join(text),
        "tokens": tokens or len(arrivals),
        "ttft_s": arrivals[0] - started if arrivals else None,
        "latency_s": ended - started,
        "gaps": [b - a for a, b in zip(arrivals, arrivals[1:])],
        "drafted": figures.get("drafted", 0),
        "accepted": figures.get("accepted", 0),
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def run_level(port: int, prompts: list[str], clients: int, per_client: int, max_tokens: int, timeout: float) -> dict:
    """clients x per_client requests, `clients` at a time; the level's aggregate figures and its answers."""
    work = [prompts[i % len(prompts)] for i in range(clients * per_client)]
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda p: one_request(port, p, max_tokens, timeout), work))
    wall = time.perf_counter() - started
    gaps = [g for r in results for g in r["gaps"]]
    drafted, accepted = sum(r["drafted"] for r in results), sum(r["accepted"] for r in results)
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
    tokens = sum(r["tokens"] for r in results)
    return {
        "clients": clients,
        "requests": len(results),
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_s": percentile(gaps, 50),
        "itl_p95_s": percentile(gaps, 95),
        "itl_p99_s": percentile(gaps, 99),
        "tpot_s": statistics.mean(
            [(r["latency_s"] - r["ttft_s"]) / max(r["tokens"] - 1, 1) for r in results if r["ttft_s"]] or [0.0]
        ),
        "acceptance": accepted / drafted if drafted else 0.0,
        "drafted": drafted,
        "accepted": accepted,
        "gaps_s": [round(g, 5) for g in gaps],  # every inter-chunk gap: the report's latency CDF
        "answers": {r["prompt"]: r["text"] for r in results},
    }


# ---------------------------------------------------------------- the command


def parse_variants(values: list[str]) -> list[tuple[str, list[str]]]:
    """`name=override,override` -> (name, [override, ...]); the first variant is the baseline."""
    variants = []
    for value in values:
        name, sep, overrides = value.partition("=")
        if not sep or not name or not overrides:
            raise LoadError(f"--variants {value!r}: write name=override,override (e.g. off=draft=none)")
        variants.append((name, overrides.split(",")))
    if len({n for n, _ in variants}) != len(variants):
        raise LoadError("--variants: give each variant its own name")
    return variants


def measure(args: argparse.Namespace, log=print) -> list[dict]:
    """Start the servers, run every level and repeat, append each line to args.out; returns the lines."""
    from specpipe.bench.records import load_suite
    from specpipe.errors import SpecpipeError

    variants = parse_variants(args.variants)
    if min(args.concurrency) < 1 or args.requests_per_client < 1 or args.repeats < 1:
        raise LoadError("--concurrency, --requests-per-client and --repeats must be at least 1")
    try:
        prompts = [p["prompt"] for p in load_suite(args.suite, args.suite_path)]
    except SpecpipeError as e:
        raise LoadError(str(e)) from None
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    rows = []
    try:
        for name, overrides in variants:
            servers[name] = start_server([f"model={args.model}", *overrides], max(args.concurrency))
        with open(args.out, "w") as out:
            for repeat in range(args.repeats):
                for clients in args.concurrency:
                    order = variants if repeat % 2 == 0 else variants[::-1]  # alternate who goes first
                    level = {
                        name: run_level(
                            servers[name][1], prompts, clients, args.requests_per_client, args.max_tokens, args.timeout
                        )
                        for name, _ in order
                    }
                    baseline = level[variants[0][0]]["answers"]
                    for name, _ in variants:
                        r = level[name]
                        r["lossless"] = all(baseline.get(p) == t for p, t in r.pop("answers").items())
                        record = {"variant": name, "repeat": repeat, "model": args.model, **r}
                        rows.append(record)
                        out.write(json.dumps(record) + "\n")
                        out.flush()
                        log(
                            f"{name:>5} c={clients}: {r['tok_s']:7.1f} tok/s  ttft p50 {r['ttft_p50_s'] or 0:.3f}s  "
                            f"itl p99 {r['itl_p99_s'] or 0:.3f}s  acceptance {r['acceptance']:.2f}  "
                            f"lossless {r['lossless']}"
                        )
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    return rows


def table(rows: list[dict], names: list[str]) -> list[str]:
    """Markdown: per concurrency, each variant's median tok/s, its ratio over the first variant's, ITL p99."""
    base = names[0]
    head = ["concurrency", *(f"{n} tok/s" for n in names), *(f"{n} / {base}" for n in names[1:])]
    head += [f"{n} ITL p99" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in sorted({r["clients"] for r in rows}):

        def med(n: str, key: str, c: int = c) -> float:
            return statistics.median(r[key] or 0.0 for r in rows if r["clients"] == c and r["variant"] == n)

        tok = {n: med(n, "tok_s") for n in names}
        cells = [str(c), *(f"{tok[n]:.1f}" for n in names)]
        cells += [f"{tok[n] / tok[base]:.2f}x" if tok[base] else "-" for n in names[1:]]
        cells += [f"{med(n, 'itl_p99_s') * 1000:.0f} ms" for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog=TOOL, description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["off=draft=none", "on=draft=ngram,budget.k=8", "auto=draft=ngram,budget=auto"],
        help="name=override,override,... ; the first is the baseline",
    )
    ap.add_argument("--model", default="smollm2-135m", help="a packaged model (specpipe-models list)")
    ap.add_argument("--suite", default="code", help="packaged suite whose prompts are sent, cycled")
    ap.add_argument("--suite-path", default=None, help='a JSONL file of {"id", "prompt"} lines instead')
    ap.add_argument("--timeout", type=float, default=600, help="seconds per request")
    ap.add_argument("--out", default="serve_bench.jsonl")
    args = ap.parse_args(argv)
    try:
        rows = measure(args, log=lambda line: print(line, flush=True))
    except LoadError as e:
        print(f"{TOOL}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(f"{TOOL}: stopped; the finished levels are in {Path(args.out).resolve()}", file=sys.stderr)
        raise SystemExit(130) from None
    print("\n" + "\n".join(table(rows, [n for n, _ in parse_variants(args.variants)])))
    print(
        f"{TOOL}: {len(rows)} lines -> {Path(args.out).resolve()} (plots: specpipe-bench-report FILE)", file=sys.stderr
    )


if __name__ == "__main__":
    main()
