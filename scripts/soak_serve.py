"""Load test of the batching server: streaming and non-streaming clients that sometimes hang up.

    python scripts/soak_serve.py --clients 8 --seconds 180 --max-tokens 64 -- model=tiny-random draft=ngram budget.k=6

Starts `specpipe-serve` on 127.0.0.1 (port 0, max_batch = clients), learns each prompt's greedy
answer once, then runs `--clients` threads for `--seconds`: each sends a chat request for a random
prompt, streamed or not (half and half), and with probability `--disconnect` hangs up mid-answer
(a streamed one after a random number of chunks, a non-streamed one after a random delay).
Checks, and exits 1 if any fails: zero server errors (5xx, error events), every completed answer
equal to that prompt's answer (nothing lost or mixed up between rows), every hang-up the server
saw logged `client_disconnected` and ended within a few steps (its `cancel_steps`: batch steps
run between the server seeing the hang-up and the job's end), and the server's resident memory
flat over the second half (the last sample within `--rss-slack` of the first half's peak, while
the batch buffer has grown to its working size). Prints one summary line (JSON).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

PROMPTS = [
    json.loads(line)["prompt"]
    for line in (Path(__file__).resolve().parent.parent / "specpipe" / "bench" / "suites" / "code.jsonl")
    .read_text()
    .splitlines()
    if line.strip()
][:6]
MAX_CANCEL_STEPS = 3  # a hang-up ends within this many batch steps of the server seeing it


def start(overrides: list[str], clients: int) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specpipe.serve.cli",
            "port=0",
            f"max_batch={clients}",
            f"max_queue={4 * clients}",
            *overrides,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    while line := proc.stderr.readline():
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if match:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            proc.log = Path(line.rsplit("requests -> ", 1)[1].strip())  # type: ignore[attr-defined]
            return proc, int(match.group(1))
    raise SystemExit(f"soak_serve: the server did not start ({overrides})")


def stream(port: int, prompt: str, max_tokens: int, hang_up_after: int | None) -> tuple[int, str, bool]:
    """(status, text, completed): completed is False when we hung up or the stream was cut."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True, "max_tokens": max_tokens}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        text = resp.read().decode()
        conn.close()
        return resp.status, text, False
    text, chunks, done = [], 0, False
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        event = json.loads(line[6:])
        if "error" in event:
            conn.close()
            return 500, event["error"]["message"], False
        text.append(event["choices"][0]["delta"].get("content", ""))
        chunks += 1
        if hang_up_after is not None and chunks >= hang_up_after:
            break
    resp.close()
    conn.close()
    return 200, "".join(text), done


def whole(port: int, prompt: str, max_tokens: int, hang_up_after_s: float | None) -> tuple[int, str, bool]:
    """A non-streamed request: (status, text, completed); with hang_up_after_s, the socket is closed
    that long after the request was sent (the answer may or may not have come)."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}).encode()
    if hang_up_after_s is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read().decode()
        conn.close()
        if resp.status != 200:
            return resp.status, raw, False
        return 200, json.loads(raw)["choices"][0]["message"]["content"], True
    with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (port, len(body), body)
        )
        time.sleep(hang_up_after_s)
    return 200, "", False


def metric(port: int, name: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def soak(
    overrides: list[str],
    clients: int,
    seconds: float,
    max_tokens: int,
    disconnect: float,
    rss_slack: float,
    seed: int = 0,
) -> dict:
    proc, port = start(overrides, clients)
    try:
        expected = {p: stream(port, p, max_tokens, None)[1] for p in PROMPTS}  # each answer once, alone
        rss = [rss_mib(proc.pid)]
        lock, tally = (
            threading.Lock(),
            {
                "stream": 0,
                "whole": 0,
                "completed": 0,
                "hung_up": 0,
                "errors": [],
                "mixed": 0,
                "rejected": 0,
            },
        )
        deadline = time.monotonic() + seconds

        def client(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            while time.monotonic() < deadline:
                prompt = rng.choice(PROMPTS)
                hang_up = rng.random() < disconnect
                if rng.random() < 0.5:
                    kind, hang = "stream", rng.randint(1, 8) if hang_up else None
                    status, text, done = stream(port, prompt, max_tokens, hang)
                else:
                    kind, hang = "whole", rng.uniform(0.02, 0.3) if hang_up else None
                    status, text, done = whole(port, prompt, max_tokens, hang)
                with lock:
                    tally[kind] += 1
                    if status == 429:
                        tally["rejected"] += 1
                    elif status != 200:
                        tally["errors"].append(f"{status}: {text[:120]}")
                    elif hang is not None and not done:
                        tally["hung_up"] += 1
                    elif done:
                        tally["completed"] += 1
                        tally["mixed"] += text != expected[prompt]
                    else:
                        tally["errors"].append("a stream ended without [DONE]")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(2)
            rss.append(rss_mib(proc.pid))
        time.sleep(1.0)  # the last hang-ups are noticed at the next step
        cancelled = metric(port, 'specpipe_requests_total{status="cancelled"}')
        records = [json.loads(line) for line in proc.log.read_text().splitlines() if line.strip()]
        left = [r for r in records if r.get("finish_reason") == "client_disconnected"]
        waits = sorted(r["cancel_s"] for r in left if "cancel_s" in r)
        steps = sorted(r["cancel_steps"] for r in left if "cancel_steps" in r)
        worst_steps = steps[-1] if steps else 0
        warm = max(rss[: max(1, len(rss) // 2)])  # the batch buffer grows to its working size first
        result = {
            "clients": clients,
            "seconds": seconds,
            **{k: v for k, v in tally.items() if k != "errors"},
            "errors": len(tally["errors"]),
            "first_errors": tally["errors"][:3],
            "cancelled": cancelled,
            "disconnects_logged": len(left),
            "disconnects_unfinished": len(left) - len(waits),
            "cancel_s_median": waits[len(waits) // 2] if waits else None,
            "cancel_s_max": waits[-1] if waits else None,
            "cancel_steps_median": steps[len(steps) // 2] if steps else None,
            "cancel_steps_max": worst_steps,
            "server_5xx": sum(1 for r in records if r.get("status", 200) >= 500),
            "rss_mib_warm": round(warm, 1),
            "rss_mib_last": round(rss[-1], 1),
            "rss_mib_max": round(max(rss), 1),
        }
        result["ok"] = (
            not tally["errors"]
            and not tally["mixed"]
            and tally["completed"] > 0
            and (tally["hung_up"] == 0 or cancelled > 0)
            and len(waits) == len(left)  # every hang-up the server saw ended (none decoded to its max_tokens)
            and worst_steps <= MAX_CANCEL_STEPS
            and rss[-1] <= warm * (1 + rss_slack)
        )
        return result
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--disconnect", type=float, default=0.3, help="share of requests hung up mid-stream")
    ap.add_argument("--rss-slack", type=float, default=0.15)
    ap.add_argument("overrides", nargs="*", default=["draft=ngram", "budget.k=8"])
    args = ap.parse_args()
    result = soak(args.overrides, args.clients, args.seconds, args.max_tokens, args.disconnect, args.rss_slack)
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
