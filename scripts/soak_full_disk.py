"""Soak of `specpipe-serve` whose run folder fills up: the server must keep answering and say so.

    mount -t tmpfs -o size=64k tmpfs /mnt/tiny   # as root; any small filesystem will do
    python scripts/soak_full_disk.py --run-dir /mnt/tiny/run --clients 4 --seconds 60 -- model=tiny-random draft=ngram

Starts `specpipe-serve` on 127.0.0.1 with `hydra.run.dir=--run-dir`, then runs `--clients` threads for `--seconds`,
each sending chat requests for a random prompt, streamed or not (half and half), while another thread asks
/health twice a second. Once `requests.jsonl` / `steps.jsonl` fill the disk the server says so on stderr.
Checks, and exits 1 if any fails: no request hung (each answered within `--timeout`), every answer equal to the
first answer of its prompt (greedy: nothing lost or mixed up) or an error object of one line, every stream ended
with [DONE], /health "ok" before the first "cannot write" line and "degraded" from a second after it, the
server's stop exit 143. Prints one summary line (JSON).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time

PROMPTS = ["Count to ten:", "Name three colours.", "def add(a, b):", "The capital of France is", "Once upon"]


def start(run_dir: str, clients: int, overrides: list[str]) -> tuple[subprocess.Popen, int, list]:
    command = [sys.executable, "-m", "specpipe.serve.cli", "port=0", f"max_batch={clients}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([*command, *overrides], stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    while line := proc.stderr.readline():
        lines.append((time.monotonic(), line.rstrip("\n")))
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if match:

            def drain() -> None:
                for rest in proc.stderr:
                    lines.append((time.monotonic(), rest.rstrip("\n")))

            threading.Thread(target=drain, daemon=True).start()
            return proc, int(match.group(1)), lines
    raise SystemExit(f"soak_full_disk: the server did not start: {lines}")


def ask(port: int, prompt: str, stream: bool, max_tokens: int, timeout: float) -> tuple[str, str]:
    """(outcome, text): outcome is "answer", "error" (an error object of one line) or "bad" (anything else)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": stream}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        message = json.loads(resp.read())["error"]["message"]
        return ("error" if "\n" not in message else "bad"), message
    if not stream:
        return "answer", json.loads(resp.read())["choices"][0]["message"]["content"]
    pieces, done = [], False
    for raw in resp:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            event = json.loads(line[6:])
            if "error" in event:
                return "error", event["error"]["message"]
            pieces.append(event["choices"][0]["delta"].get("content") or "")
    return ("answer" if done else "bad"), "".join(pieces)


def health(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/health")
    return json.loads(conn.getresponse().read())["status"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--timeout", type=float, default=60, help="a request not answered within this has hung")
    ap.add_argument("overrides", nargs="*", default=["model=tiny-random", "draft=ngram"])
    args = ap.parse_args()
    proc, port, lines = start(args.run_dir, args.clients, args.overrides)
    deadline = time.monotonic() + args.seconds
    answers: dict[str, str] = {}
    counts = {"requests": 0, "answers": 0, "errors": 0, "hung": 0, "mixed_up": 0, "bad": 0}
    healths: list[tuple[float, str]] = []
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            prompt = rng.choice(PROMPTS)
            try:
                outcome, text = ask(port, prompt, rng.random() < 0.5, args.max_tokens, args.timeout)
            except TimeoutError:
                outcome, text = "hung", ""
            with lock:
                counts["requests"] += 1
                key = {"answer": "answers", "error": "errors", "hung": "hung", "bad": "bad"}[outcome]
                counts[key] += 1
                if outcome == "answer" and answers.setdefault(prompt, text) != text:
                    counts["mixed_up"] += 1

    def watch() -> None:
        while time.monotonic() < deadline:
            healths.append((time.monotonic(), health(port)))
            time.sleep(0.5)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    threads.append(threading.Thread(target=watch))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    full = [at for at, line in lines if "cannot write" in line]
    first_full = min(full) if full else None
    lies = [
        (round(at - (first_full or at), 2), status)
        for at, status in healths
        if (first_full is None or at < first_full)
        and status != "ok"
        or first_full
        and at > first_full + 1
        and status != "degraded"
    ]
    summary = {
        **counts,
        "cannot_write_lines": len(full),
        "disk_full_after_s": round(first_full - (healths[0][0] if healths else first_full), 1) if first_full else None,
        "health_checks": len(healths),
        "health_untruthful": len(lies),
        "exit": code,
    }
    print(json.dumps(summary))
    failed = (
        len(full) > 2
        or counts["hung"]
        or counts["mixed_up"]
        or counts["bad"]
        or lies
        or code != 143
        or not counts["answers"]
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
