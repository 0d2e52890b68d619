"""`specpipe-serve`: the Hydra app over conf/serve.yaml. Loads the Session once, then serves the
OpenAI API on `host:port` until SIGINT / SIGTERM (exit 130 / 143, one line).

Every finished request is one line of `requests.jsonl` in the run folder (tokens, finish reason,
time queued, acceptance, tokens per forward, decode tok/s, TTFT). Requests are decoded one at a
time (batch 1); concurrent requests wait in a bounded queue (`queue=16`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import specpipe.serve.config  # noqa: F401  (registers serve_schema before any compose)
from specpipe.cli.shell import EXIT_CONFIG, fail, hydra_main, hydra_output_dir

TOOL = "specpipe-serve"


def main() -> None:
    hydra_main(TOOL, "serve", _task, interrupted=" while loading the model")


def _task(cfg) -> None:
    from specpipe.serve.http import ServeState, make_server
    from specpipe.serve.worker import GenerationWorker
    from specpipe.session import Session

    if not 0 <= cfg.port <= 65535:
        fail(TOOL, f"port={cfg.port}: choose 1..65535 (0: any free port)", EXIT_CONFIG)
    session = Session(cfg)
    out = Path(hydra_output_dir() or "outputs/serve/last")
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "requests.jsonl", "a", encoding="utf-8")
    lock = threading.Lock()

    def log(record: dict) -> None:
        with lock:
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()

    worker = GenerationWorker(session, max_waiting=cfg.queue)
    try:
        server = make_server(ServeState(session, worker, session.target.info.name, log), cfg.host, cfg.port)
    except OSError as exc:
        fail(TOOL, f"cannot listen on {cfg.host}:{cfg.port} ({exc.strerror}): choose another port=, or port=0 for any free one",
             EXIT_CONFIG)
    host, port = str(server.server_address[0]), server.server_address[1]
    stopped = {}

    def stop(signum, _frame):
        stopped["signal"] = signum
        threading.Thread(target=server.shutdown, daemon=True).start()  # shutdown() waits for serve_forever

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    info = session.target.info
    print(f"{TOOL}: {info.name} ({info.precision}), drafter={session.drafter.name}, budget={session.budget_label()}; "
          f"OpenAI API on http://{host}:{port}/v1 (chat/completions, completions, models); requests -> {out / 'requests.jsonl'}",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        worker.close()
        log_file.close()
    sig = stopped.get("signal")
    if sig is not None:
        name = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
        print(f"{TOOL}: stopped ({name}); every finished request is in {out / 'requests.jsonl'}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Everything is written and closed. Skip interpreter teardown: with connection threads still
        # alive, MLX / OpenMP destructors at exit have aborted the process (exit -6 instead of 143).
        os._exit(143 if sig == signal.SIGTERM else 130)


if __name__ == "__main__":
    main()
