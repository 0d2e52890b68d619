"""`specpipe-bench-turns`: the conversations suite (bench/conversations.py) turn after turn, with the prefix store
on and off, through the chat's engine (a Session in this process), through `specpipe-serve`, and through mlx-lm's
own server on the same weights as the anchor.

Contract: for every turn of every conversation, each path answers the turn's messages (the chat template over the
system prompt, the earlier turns and that path's own earlier answers), the paths' order alternating per turn so
a busy machine slows them alike; one JSON line per (turn, path) goes to `--out`: time to first token and to the
end on one clock, prompt tokens, tokens taken from a cache and tokens prefilled, and whether the answer equals the
store-off answer of the same path (`same_as_off`) and the chat engine's store-off answer (`same_as_session_off`).
Beside the session's store-off run, `new_only_s` times the target alone prefilling only the turn's new tokens
(those after the longest prefix shared with an earlier turn's prompt and answer) plus the first token: what a
perfect cache would cost. A per-turn line and a summary follow on stderr. Greedy, loopback only, bounded by
`--timeout` per request; it stops the servers it started.

    specpipe-bench-turns --max-tokens 32 --out turns.jsonl -- draft=ngram budget.k=8 blas.threads=2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

TOOL = "specpipe-bench-turns"
PATHS = ("session", "serve", "mlx_lm")
STORE_ON, STORE_OFF = ["prefix_cache.enabled=true"], ["prefix_cache.enabled=false"]


class TurnsError(Exception):
    """A bad argument or a server that would not start: one line for the user."""


# ---------------------------------------------------------------- the paths a turn is sent through


class SessionPath:
    """The chat's engine: a Session in this process, its store on or off."""

    def __init__(self, session):
        self.session = session

    def ask(self, messages: list[dict], max_tokens: int, timeout: float) -> dict:
        from specpipe.events import Emitted, RunFinished

        ids = self.session.encode(messages=messages)
        started = time.perf_counter()
        first = None
        finished = None
        for event in self.session.generate(ids, max_tokens=max_tokens):
            if first is None and isinstance(event, Emitted) and event.token_ids:
                first = time.perf_counter()
            if isinstance(event, RunFinished):
                finished = event
        ended = time.perf_counter()
        assert finished is not None  # the pipeline always ends with RunFinished
        s = finished.stats
        return {
            "text": finished.text,
            "ttft_s": (first or ended) - started,
            "wall_s": ended - started,
            "prompt_tokens": len(ids),
            "cached_tokens": s.cached_tokens,
            "prompt_ids": ids,
            "answer_ids": finished.token_ids,
        }


class ServerPath:
    """An OpenAI-compatible server on 127.0.0.1 (specpipe-serve or mlx_lm.server), streamed."""

    def __init__(self, port: int):
        self.port = port

    def ask(self, messages: list[dict], max_tokens: int, timeout: float) -> dict:
        from specpipe.bench.chat_client import stream_chat

        return stream_chat(self.port, messages, max_tokens, timeout)


def new_only_seconds(target, prompt_ids: list[int], earlier: list[list[int]]) -> tuple[int, float]:
    """The new tokens of a prompt (after its longest prefix shared with an earlier context) and the seconds the
    target alone takes to prefill them and give the first token, the shared part already in its cache."""
    import mlx.core as mx

    shared = max((_common(prompt_ids, e) for e in earlier), default=0)
    shared = min(shared, len(prompt_ids) - 1)
    cache = target.make_cache()
    if shared:
        target.prefill(prompt_ids[:shared], cache)
    started = time.perf_counter()
    target.prefill(prompt_ids[shared:-1], cache)
    mx.eval(mx.argmax(target.forward(prompt_ids[-1:], cache).logits[-1]))
    return len(prompt_ids) - shared, time.perf_counter() - started


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---------------------------------------------------------------- building the paths


def compose_session_config(overrides: list[str]):
    from hydra import compose, initialize_config_module

    import specpipe.config.schema  # noqa: F401  (registers the schemas and resolvers)

    with initialize_config_module(config_module="specpipe.conf", version_base=None):
        return compose(config_name="config", overrides=["sampling=greedy", *overrides])


def open_paths(args: argparse.Namespace, stack: ExitStack, log) -> tuple[dict, object]:
    """Every path asked for, started; returns {name: path} and the target Engine (None without the session)."""
    from specpipe.engine.load.loader import load_target
    from specpipe.run.session import Session

    paths: dict = {}
    target = None
    if "session" in args.paths or "mlx_lm" in args.paths:
        cfg_on = compose_session_config(args.overrides + STORE_ON)
        target = load_target(cfg_on)
        if "session" in args.paths:
            paths["session-off"] = SessionPath(Session(compose_session_config(args.overrides + STORE_OFF), target))
            paths["session-on"] = SessionPath(Session(cfg_on, target=target))
    if "serve" in args.paths:
        from specpipe.bench.serve_load import LoadError, start_server

        for name, extra in (("serve-off", STORE_OFF), ("serve-on", STORE_ON)):
            try:
                proc, port = start_server([*args.overrides, *extra], args.max_batch)
            except LoadError as exc:
                raise TurnsError(str(exc)) from None
            stack.callback(_stop, proc)
            paths[name] = ServerPath(port)
    if "mlx_lm" in args.paths:
        from specpipe.bench.mlx_server import MlxLmServer, model_folder

        folder = model_folder(target)
        log(f"[turns] mlx_lm server on {folder} (its log: {args.out}.mlx_lm.log)")
        try:
            log_path = Path(f"{args.out}.mlx_lm.log")
            server = stack.enter_context(MlxLmServer(folder, args.max_tokens, log_path, args.blas_threads))
        except RuntimeError as exc:
            raise TurnsError(str(exc)) from None
        paths["mlx_lm"] = ServerPath(server.port)
    return paths, target


def _stop(proc) -> None:
    proc.terminate()
    proc.wait(timeout=60)


# ---------------------------------------------------------------- the sitting


def run(args: argparse.Namespace, log) -> list[dict]:
    from specpipe.bench.conversations import conversations, messages_for

    chosen = [c for c in conversations() if any(c.name.startswith(p) for p in args.conversations)]
    if not chosen:
        raise TurnsError(f"--conversations {' '.join(args.conversations)}: none matches doc, short or system")
    rows: list[dict] = []
    with ExitStack() as stack, open(args.out, "w", encoding="utf-8") as out:
        paths, target = open_paths(args, stack, log)
        names = list(paths)
        _warm_up(paths, args)
        earlier: list[list[int]] = []  # every context the session has seen: what a perfect cache could hold
        n = 0
        for conv in chosen:
            answers: dict[str, list[str]] = {name: [] for name in names}
            for turn in range(len(conv.turns)):
                order = names if n % 2 == 0 else names[::-1]
                n += 1
                got = {
                    name: paths[name].ask(messages_for(conv, turn, answers[name]), args.max_tokens, args.timeout)
                    for name in order
                }
                off = got.get("session-off")
                if off is not None and target is not None:
                    new, seconds = new_only_seconds(target, off["prompt_ids"], earlier)
                    off.update(new_tokens=new, new_only_s=seconds)
                    earlier.append(off["prompt_ids"] + off["answer_ids"])
                line = []
                for name in names:
                    r = got[name]
                    answers[name].append(r["text"])
                    record = _record(conv.name, turn, name, r, got)
                    rows.append(record)
                    out.write(json.dumps(record) + "\n")
                    line.append(_cell(record))
                out.flush()
                new_only = f", new-only {off['new_only_s']:.2f}s ({off['new_tokens']} new)" if off else ""
                log(f"[turns {conv.name} {turn + 1}/{len(conv.turns)}]{new_only} | " + " | ".join(line))
    return rows


def _warm_up(paths: dict, args: argparse.Namespace) -> None:
    """One short untimed request per path (allocation, BLAS threads, mlx_lm's lazy model load)."""
    messages = [{"role": "user", "content": "Say hello."}]
    for path in paths.values():
        path.ask(messages, 4, args.timeout)
        store = getattr(getattr(path, "session", None), "prefix_store", None)
        if store is not None:
            store.clear()  # the warm-up is no one's prefix


def _record(conv: str, turn: int, name: str, r: dict, got: dict) -> dict:
    path, _, store = name.partition("-")
    cached = r.get("cached_tokens") or 0
    off_name = f"{path}-off"
    record = {
        "conversation": conv,
        "turn": turn + 1,
        "path": name,
        "ttft_s": r["ttft_s"],
        "wall_s": r["wall_s"],
        "prompt_tokens": r.get("prompt_tokens"),
        "cached_tokens": r.get("cached_tokens"),
        "prefilled_tokens": (r["prompt_tokens"] - cached) if r.get("prompt_tokens") is not None else None,
        "same_as_off": r["text"] == got[off_name]["text"] if off_name in got else None,
        "same_as_session_off": r["text"] == got["session-off"]["text"] if "session-off" in got else None,
        "text": r["text"],
    }
    for key in ("new_tokens", "new_only_s"):
        if key in r:
            record[key] = r[key]
    return record


def _cell(r: dict) -> str:
    same = "" if r["same_as_off"] in (None, True) else " DIFFERS from off"
    cached = f", {r['cached_tokens']} cached" if r["cached_tokens"] else ""
    return f"{r['path']} ttft {r['ttft_s']:.2f}s{cached}{same}"


def summary(rows: list[dict]) -> list[str]:
    """Per workload (doc, short, system: the system-N conversations are one workload, request after request) and
    path: TTFT of its first request and the median of the later ones, their ratio to new-only, and whether every
    answer equals the path's own store-off answer (mlx_lm: the chat engine's store-off answer)."""
    lines = []
    for group in dict.fromkeys(r["conversation"].split("-")[0] for r in rows):
        mine = [r for r in rows if r["conversation"].split("-")[0] == group]
        firsts = {(r["conversation"], r["turn"]) for r in mine}
        first = min(firsts, key=lambda key: [(r["conversation"], r["turn"]) for r in mine].index(key))
        ideal = [r["new_only_s"] for r in mine if "new_only_s" in r and (r["conversation"], r["turn"]) != first]
        ideal_med = statistics.median(ideal) if ideal else None
        for path in dict.fromkeys(r["path"] for r in mine):
            runs = [r for r in mine if r["path"] == path]
            later = [r["ttft_s"] for r in runs if (r["conversation"], r["turn"]) != first]
            cell = f"first {runs[0]['ttft_s']:.2f}s"
            if later:
                med = statistics.median(later)
                vs = f" = {med / ideal_med:.1f}x new-only" if ideal_med else ""
                cell += f", later median {med:.2f}s{vs}"
            key, against = (
                ("same_as_off", "store-off")
                if path.endswith(("-on", "-off"))
                else (
                    "same_as_session_off",
                    "session-off",
                )
            )
            compared = [r[key] for r in runs if r[key] is not None]  # None: that path did not run in this sitting
            verdict = ("yes" if all(compared) else "NO") if compared else f"not compared (no {against} path)"
            lines.append(f"[turns] {group} {path}: {cell}, answers equal to {against}: {verdict}")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog=TOOL, description=__doc__.splitlines()[0])
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    ap.add_argument("--conversations", nargs="+", default=["doc", "short", "system"], help="names or prefixes")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=8, help="specpipe-serve's max_batch (1: its batch-1 worker)")
    ap.add_argument("--blas-threads", type=int, default=2, help="every process's BLAS threads, the same for all")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per request")
    ap.add_argument("--out", default="turns.jsonl")
    ap.add_argument("overrides", nargs="*", help="config overrides for the Session and specpipe-serve (after --)")
    args = ap.parse_args(argv)
    args.overrides = [*args.overrides, f"blas.threads={args.blas_threads}"]
    from specpipe.cli.shell import preload_blas

    sys.argv = [sys.argv[0], *args.overrides]  # preload_blas reads blas.threads from the command line
    preload_blas()
    from specpipe.engine.load.blas import blas_info, blas_phrase

    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    log(f"[turns] {blas_phrase(blas_info())}, max_tokens={args.max_tokens}, overrides: {' '.join(args.overrides)}")
    try:
        rows = run(args, log)
    except TurnsError as exc:
        print(f"{TOOL}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(f"{TOOL}: stopped; the finished turns are in {Path(args.out).resolve()}", file=sys.stderr)
        raise SystemExit(130) from None
    for line in summary(rows):
        log(line)
    log(f"{TOOL}: {len(rows)} lines -> {Path(args.out).resolve()}")


if __name__ == "__main__":
    main()
