"""`specpipe-serve`: the Hydra app over conf/serve.yaml. Loads the Session once, then serves the
OpenAI API on `host:port` until SIGINT / SIGTERM / SIGHUP (exit 130 / 143 / 129, one line).

Every finished request is one line of `requests.jsonl` in the run folder (tokens, finish reason,
time queued, acceptance, tokens per forward, decode tok/s, TTFT). Up to `max_batch` requests
are decoded together (specpipe/batch/: the one step, core/step.py, with one target forward over
every row's draft); more wait in a bounded queue (`max_queue`, then 429); every value is in
conf/serve.yaml. Every drafter batches: each row has its own drafter (a draft model's cache, an
MTP head's, layer skip's), sampler and budget, built from `cfg.draft` / `cfg.budget` with
`build_plugin` as a CLI run builds them (`budget=auto`, `adaptive`, `confidence` plan each row's K
from that row's acceptance; `auto` rows draft up to the width that gives the batch the most tokens per second,
priced from T(B, n) timed on the first start and cached: batch/pricing.py); recurrent, hybrid and sliding-window
targets batch too (batch/cache.py).
Token trees (tree=static|dynamic, draft=lookahead) batch too: each tree row's nodes sit in the batch's
mask. A target whose cache the batch cannot hold is served one request at a time, said in one line at
start naming what to use instead. Every batched step's rows, their K
and their budgets' reasons are a line of `steps.jsonl`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import specpipe.serve.config  # noqa: F401  (registers serve_schema before any compose)
from specpipe.cli.shell import EXIT_CONFIG, fail, hydra_main, hydra_output_dir
from specpipe.serve.api_key import API_KEY_ENV
from specpipe.serve.run_log import JsonlLog

TOOL = "specpipe-serve"


def main() -> None:
    hydra_main(TOOL, "serve", _task, interrupted=" while loading the model")


def _task(cfg) -> None:
    from specpipe.run.session import Session
    from specpipe.serve.http import ServeState, make_app
    from specpipe.serve.prometheus import Metrics

    if not 0 <= cfg.port <= 65535:
        fail(TOOL, f"port={cfg.port}: choose 1..65535 (0: any free port)", EXIT_CONFIG)
    _check_values(cfg)  # before the model loads, as the address is: a refused value costs no load
    listen = _listen_policy(cfg)
    session = Session(cfg)
    out = Path(hydra_output_dir() or "outputs/serve/last")
    out.mkdir(parents=True, exist_ok=True)
    requests_log, steps_log = JsonlLog(out / "requests.jsonl", TOOL), JsonlLog(out / "steps.jsonl", TOOL)
    metrics = Metrics(session.prefix_store, session.history)
    worker, how = _worker(cfg, session, metrics, steps_log.write, requests_log.write)
    try:
        sock = _bind(cfg.host, cfg.port)
    except OSError as exc:
        worker.close()
        fail(
            TOOL,
            f"cannot listen on {cfg.host}:{cfg.port} ({exc.strerror}): "
            f"choose another port=, or port=0 for any free one",
            EXIT_CONFIG,
        )
    host, port = str(sock.getsockname()[0]), int(sock.getsockname()[1])
    policy = listen(port)
    state = ServeState(session, worker, session.target.info.name, requests_log.write, metrics)
    state.problems = lambda: [p for p in (requests_log.problem(), steps_log.problem()) if p]
    app = make_app(state, policy, access_log=_console_line if cfg.access_log else None)
    server = _uvicorn(app, cfg.shutdown_grace_s, cfg.keep_alive_s)
    stopped = {}

    def stop(signum: int) -> None:
        stopped["signal"] = signum
        # Decoding stops at the next step: in-flight requests end cut (finish_reason "length",
        # specpipe.cut "shutdown"), waiting ones get a 503; then uvicorn finishes their responses.
        threading.Thread(target=worker.close, daemon=True).start()
        server.should_exit = True

    info = session.target.info
    shown = f"[{host}]" if ":" in host else host
    if not policy.hosts:
        print(
            f"{TOOL}: listening beyond this machine on {shown}:{port} (allow_remote=true): "
            "every request needs Authorization: Bearer <api_key>; use TLS (a proxy) on untrusted networks",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"{TOOL}: {info.name} ({info.precision}), drafter={session.drafter.name}, "
        f"budget={session.budget_label()}, {how}; "
        f"OpenAI API on http://{shown}:{port}/v1 (chat/completions, completions, models); "
        f"requests -> {out / 'requests.jsonl'}",
        file=sys.stderr,
        flush=True,
    )

    async def serve() -> None:
        from specpipe.run.signals import STOP_SIGNALS

        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:  # a closed terminal (SIGHUP) stops the server as SIGTERM does
            if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                loop.add_signal_handler(sig, stop, sig)
        await server.serve(sockets=[sock])

    try:
        asyncio.run(serve())
    finally:
        worker.close()
        requests_log.close()
        steps_log.close()
    sig = stopped.get("signal")
    if sig is not None:
        name = "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name
        print(
            f"{TOOL}: stopped ({name}); every finished request is in {out / 'requests.jsonl'}",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        # Everything is written and closed. Skip interpreter teardown: with the decoding thread
        # possibly still alive, MLX / OpenMP destructors at exit have aborted the process (-6, not 143).
        os._exit(128 + sig)


def _check_values(cfg) -> None:
    """The server's own values (conf/serve.yaml) in range, or one line and exit 2."""
    if cfg.prefix_wait_tokens < 0:
        fail(TOOL, f"prefix_wait_tokens={cfg.prefix_wait_tokens}: need 0 (never wait) or more", EXIT_CONFIG)
    if cfg.max_batch < 1 or cfg.max_queue < 1 or cfg.prefill_per_step < 0:
        fail(
            TOOL,
            f"max_batch={cfg.max_batch}, max_queue={cfg.max_queue}, prefill_per_step={cfg.prefill_per_step}: "
            "need max_batch >= 1, max_queue >= 1, prefill_per_step >= 0",
            EXIT_CONFIG,
        )
    if cfg.shutdown_grace_s < 0 or cfg.keep_alive_s <= 0:
        fail(
            TOOL,
            f"shutdown_grace_s={cfg.shutdown_grace_s}, keep_alive_s={cfg.keep_alive_s}: "
            "need shutdown_grace_s >= 0 and keep_alive_s > 0 (seconds)",
            EXIT_CONFIG,
        )


def _console_line(line: str) -> None:
    print(f"{TOOL}: {line}", file=sys.stderr, flush=True)


def _listen_policy(cfg):
    """Who may connect (serve/guard.py), as a function of the bound port; refuses, in one line, a
    non-loopback host without allow_remote=true and an API key."""
    from specpipe.serve.guard import is_loopback, policy_for

    key = cfg.api_key or os.environ.get(API_KEY_ENV) or None
    if not is_loopback(cfg.host):
        if not cfg.allow_remote:
            fail(
                TOOL,
                f"host={cfg.host} listens beyond this machine: add allow_remote=true and an api_key= "
                f"(or {API_KEY_ENV}), or use host=127.0.0.1",
                EXIT_CONFIG,
            )
        if not key:
            fail(
                TOOL,
                f"host={cfg.host} with allow_remote=true needs an API key: api_key=... or {API_KEY_ENV}=...",
                EXIT_CONFIG,
            )
    bad = [o for o in cfg.allowed_origins if not str(o).startswith(("http://", "https://")) or str(o).count("/") > 2]
    if bad:
        fail(
            TOOL,
            f"allowed_origins: {bad[0]!r} is not an origin: write scheme://host[:port], e.g. http://localhost:3000",
            EXIT_CONFIG,
        )
    return lambda port: policy_for(cfg.host, port, bool(cfg.allow_remote), key, [str(o) for o in cfg.allowed_origins])


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may reuse a port in TIME_WAIT
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def _uvicorn(app, grace_s: float, keep_alive_s: float):
    """uvicorn with h11 (strict framing: a bad Content-Length or chunked body is a 400), no access log
    (requests.jsonl is the log), and its own logging above warnings only; after SIGTERM in-flight
    responses get `grace_s` to be written, an idle kept-alive connection closes after `keep_alive_s`."""
    import logging

    import uvicorn

    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.ERROR)
    config = uvicorn.Config(
        app,
        http="h11",
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
        # uvicorn annotates these as int but passes them to asyncio's timers, which take seconds as floats
        timeout_graceful_shutdown=grace_s,  # type: ignore[arg-type]
        timeout_keep_alive=keep_alive_s,  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]  # ours tell the signals apart
    return server


def _worker(cfg, session, metrics, log_step, log=None):
    """The batching worker when the target allows it, else one request at a time; and a few words saying which."""
    from specpipe.batch.decoder import BatchDecoder, session_plugins
    from specpipe.serve.batch_worker import BatchWorker
    from specpipe.serve.worker import GenerationWorker

    why = batch_refusal(session) if cfg.max_batch > 1 else "max_batch=1"
    if why:
        if cfg.max_batch > 1:
            print(f"{TOOL}: {why}; serving one request at a time", file=sys.stderr, flush=True)
        return GenerationWorker(session, max_waiting=cfg.max_queue, metrics=metrics, log=log), "batch 1"
    decoder = BatchDecoder(
        session.target,
        session_plugins(session),
        pricing=_batch_pricing(cfg, session),
        prefix_store=session.prefix_store,
    )
    worker = BatchWorker(
        decoder,
        cfg.max_batch,
        cfg.max_queue,
        metrics,
        log_step,
        prefill_per_step=cfg.prefill_per_step,
        log=log,
        prefix_wait_tokens=cfg.prefix_wait_tokens,
    )
    return (
        worker,
        f"max_batch={cfg.max_batch}, each row's own budget={session.budget_label()}; each step -> steps.jsonl",
    )


def _batch_pricing(cfg, session):
    """budget=auto with a drafter: each step's width for the batch from T(B, n) (timed on the first start on this
    device, then cached: a start-up step, never a request's) and the rows' own rates; else None."""
    from specpipe.batch.costs import cost_table
    from specpipe.batch.pricing import BatchPricing

    if cfg.budget.name != "auto" or session.drafter.name == "none":
        return None
    costs, where = cost_table(session.target, cfg.max_batch, int(cfg.budget.k_max) + 1)
    print(f"{TOOL}: {costs.describe()} ({where})", file=sys.stderr, flush=True)
    return BatchPricing(costs, int(cfg.budget.k_max))


def batch_refusal(session) -> str | None:
    """Why this session's requests cannot share a batch (one line naming what to use), or None.

    Every drafter and token trees batch (each row proposes with its own drafter, budget and sampler; a drafter
    that attends to the target's K/V reads its request's row of the batch); what cannot yet: a target with
    cache layers the batch cannot hold (batch/cache.py storage_refusal)."""
    from specpipe.batch.decoder import refusal

    return refusal(session.target)


if __name__ == "__main__":
    main()
