"""Long-context figures that fit a slow CPU: each prompt is prefilled for real once per engine
(specpipe plain, then mlx-lm's `stream_generate` on the same model object, back to back), and
every decode variant then starts from a copy of specpipe's prefilled cache.

Per `longctx` prompt (the "late" question of each size):

1. real prefill: specpipe plain (kv=full) and mlx-lm, prefill tok/s, TTFT, decode tok/s, peak MiB;
2. decode A/B on the restored cache, `--repeats` rounds, order flipped each round: plain,
   draft=ngram fixed K=4, ngram budget=auto, and ngram auto with its long-context curve switched
   off ("auto, short-context T(n)": what auto did before it timed T(n) at the cache's length);
   decode tok/s (median), speed-up over plain's median, acceptance, mean K of drafting steps;
3. `--quantized` sizes: the full prefilled cache quantized to 8 and 4 bits (mlx-lm's
   KVCache.to_quantized, what `--kv-bits` does) and plain decoding on each: decode tok/s, peak MiB
   (the held snapshots included, named), KV KiB per position. Their prefill is not re-run: on this
   CPU a quantized prefill runs at a fifth of full precision's (docs/benchmarks.md).

Greedy: every ngram row must emit plain's tokens on the same cache (checked, marked in the table).

    python scripts/longctx_reuse.py --sizes 1k 4k 8k --quantized 4k 8k
    python scripts/longctx_reuse.py --model qwen2.5-coder-1.5b --sizes 1k 4k --quantized 4k
    python scripts/longctx_reuse.py --model qwen2.5-coder-1.5b --sizes 8k 16k --quantized 8k 16k  # 16k: longctx-32k
"""

from __future__ import annotations

import argparse
import statistics
import time

from specpipe.engine.load.blas import blas_info, preload_blas

preload_blas()

import mlx.core as mx  # noqa: E402
from hydra import compose, initialize_config_module  # noqa: E402

import specpipe.config  # noqa: E402,F401  (registers the schemas)
from specpipe.bench.records import load_suite  # noqa: E402
from specpipe.costmodel.context_curve import context_curves  # noqa: E402
from specpipe.engine.kv import FullKV  # noqa: E402
from specpipe.engine.load.loader import load_engine  # noqa: E402
from specpipe.events import Drafted, RunFinished  # noqa: E402
from specpipe.session import Session  # noqa: E402

DECODE_ROWS = {  # label -> overrides
    "plain": ["draft=none"],
    "ngram K=4": ["draft=ngram", "budget=fixed", "budget.k=4"],
    "ngram auto": ["draft=ngram", "budget=auto"],
    "ngram auto, short-context T(n)": ["draft=ngram", "budget=auto"],
}


class PrefilledTarget:
    """The target engine, except that a prompt whose cache was snapshotted is restored, not prefilled.

    Everything else is the engine's own (attribute access falls through). `snapshot` holds each
    layer's (keys, values, offset) trimmed to the prompt; a restored cache grows into new arrays
    at its first update (the snapshot is exactly full), so runs never write into the snapshot.
    """

    def __init__(self, engine):
        self._engine = engine
        self.snapshot: list | None = None  # per layer: (keys, values, offset)
        self.record = False  # the next real prefill stores its cache as the snapshot

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def prefill_steps(self, token_ids, cache, capture=None, hidden=None):
        if self.snapshot is not None and not self.record:
            for layer, (keys, values, offset) in zip(cache, self.snapshot):
                layer.keys, layer.values, layer.offset = keys, values, offset
            yield len(token_ids)
            return
        yield from self._engine.prefill_steps(token_ids, cache, capture, hidden)
        if self.record:
            self.snapshot = [(c.keys[..., : c.offset, :], c.values[..., : c.offset, :], c.offset) for c in cache]
            mx.eval([s[:2] for s in self.snapshot])
            self.record = False


def quantized(snapshot: list, bits: int, group_size: int = 64) -> list:
    """The snapshot as mlx-lm quantizes a KVCache (to_quantized)."""
    out = [
        (mx.quantize(k, group_size=group_size, bits=bits), mx.quantize(v, group_size=group_size, bits=bits), o)
        for k, v, o in snapshot
    ]
    mx.eval([s[:2] for s in out])
    return out


def specpipe_run(session: Session, ids: list[int], max_tokens: int) -> dict:
    session.target.kv = session.target._engine.kv = session.kv  # the sessions share one target: give it this one's KV
    ks, final = [], None
    for event in session.generate(ids, max_tokens):
        if isinstance(event, Drafted) and event.draft_ids:
            ks.append(len(event.draft_ids))
        elif isinstance(event, RunFinished):
            final = event
    s = final.stats
    return {
        "tokens": final.token_ids,
        "prefill_tok_s": s.prefill_tok_s,
        "ttft_s": s.ttft_s,
        "decode_tok_s": s.decode_tok_s,
        "peak_mib": s.peak_memory_bytes / 2**20,
        "kv_kib": s.kv_bytes_per_token / 1024,
        "acceptance": s.acceptance_rate,
        "mean_k": statistics.mean(ks) if ks else 0.0,
        "drafting_steps": len(ks),
    }


def mlx_lm_run(engine, ids: list[int], max_tokens: int) -> dict:
    from mlx_lm.generate import stream_generate

    mx.reset_peak_memory()
    t0 = time.perf_counter()
    tokens, ttft, last = [], 0.0, None
    for response in stream_generate(engine.model, engine.tokenizer, mx.array(ids), max_tokens=max_tokens):
        if response.finish_reason == "stop":
            break
        if not tokens:
            ttft = time.perf_counter() - t0
        tokens.append(int(response.token))
        last = response
    return {
        "tokens": tokens,
        "prefill_tok_s": last.prompt_tps,
        "ttft_s": ttft,
        "decode_tok_s": last.generation_tps,
        "peak_mib": mx.get_peak_memory() / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sizes", nargs="+", default=["1k", "4k", "8k"])
    parser.add_argument("--quantized", nargs="*", default=["4k", "8k"], help="sizes that get the kv=quantized rows")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-mlx-lm", action="store_true")
    args = parser.parse_args()

    engine = load_engine(args.model, precision="float32")
    target = PrefilledTarget(engine)
    with initialize_config_module(version_base=None, config_module="specpipe.conf"):

        def session(*overrides: str) -> Session:
            return Session(
                compose("config", overrides=[f"model={args.model}", "quant=float32", *overrides]), target=target
            )

        decode = {label: session(*o) for label, o in DECODE_ROWS.items()}
        decode["ngram auto, short-context T(n)"].budget._context = None  # the A/B: auto without the context curve
        q_sessions = {bits: session("draft=none", "kv=quantized", f"kv.bits={bits}") for bits in (8, 4)}
    target.kv = engine.kv = FullKV()
    context_curves(target)  # timed once per device and cached: never inside a measured row
    prompts = {p["id"]: p["prompt"] for suite in ("longctx", "longctx-32k") for p in load_suite(suite)}
    print(
        f"# {args.model}, float32, {blas_info().name} ({blas_info().path}), greedy, {args.max_tokens} tokens, "
        f"decode rows: {args.repeats} rounds, order flipped per round, median"
    )
    for size in args.sizes:
        pid = f"longctx-{size}-late"
        ids = engine.encode_prompt(prompts[pid], chat=True)
        print(f"\n## {pid}: {len(ids)} prompt tokens; started {time.strftime('%H:%M:%S')}, load {_load()}", flush=True)
        print("| row | prefill tok/s | TTFT s | decode tok/s | decode vs plain | acceptance | mean K | peak MiB |")
        print("|---|---|---|---|---|---|---|---|")
        # 1. real prefills, back to back
        target.record = True
        real = specpipe_run(decode["plain"], ids, args.max_tokens)
        _row("specpipe plain (real prefill, chunk " + str(engine.prefill_chunk) + ")", real, None)
        if not args.no_mlx_lm:
            anchor = mlx_lm_run(engine, ids, args.max_tokens)
            same = "" if anchor["tokens"] == real["tokens"] else " (tokens differ from specpipe plain)"
            _row("mlx-lm stream_generate (real prefill, chunk 2048)" + same, anchor, None)
        # 2. decode A/B from the snapshot
        runs: dict[str, list[dict]] = {label: [] for label in decode}
        for rep in range(args.repeats):
            for label in list(decode) if rep % 2 == 0 else list(decode)[::-1]:
                runs[label].append(specpipe_run(decode[label], ids, args.max_tokens))
        plain = _median(runs["plain"])
        for label, rs in runs.items():
            m = _median(rs)
            same = "" if all(r["tokens"] == real["tokens"] for r in rs) else " (TOKENS DIFFER FROM PLAIN)"
            _row(label + " (restored)" + same, m, plain, prefill=False)
        # 3. quantized caches from the same prefill
        if size in args.quantized:
            full = target.snapshot
            for bits, qs in q_sessions.items():
                target.snapshot = quantized(full, bits, qs.kv.group_size)
                r = specpipe_run(qs, ids, args.max_tokens)
                held = sum(k.nbytes + v.nbytes for k, v, _ in full) / 2**20
                _row(
                    f"plain kv=quantized bits={bits} (restored; peak holds the {held:.0f} MiB float32 snapshot); "
                    f"KV {r['kv_kib']:.1f} KiB/position",
                    r,
                    plain,
                    prefill=False,
                )
            target.snapshot = full
        target.snapshot = None
        mx.clear_cache()


def _row(label: str, m: dict, plain: dict | None, prefill: bool = True) -> None:
    vs = f"{m['decode_tok_s'] / plain['decode_tok_s']:.2f}x" if plain else ""
    pre = f"{m['prefill_tok_s']:.0f} | {m['ttft_s']:.1f}" if prefill else "- | -"
    acc = f"{m['acceptance']:.0%}" if "acceptance" in m and m.get("drafting_steps") else ""
    k = f"{m['mean_k']:.1f} ({m['drafting_steps']} steps)" if m.get("drafting_steps") else ""
    print(f"| {label} | {pre} | {m['decode_tok_s']:.1f} | {vs} | {acc} | {k} | {m['peak_mib']:.0f} |", flush=True)


def _median(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda r: r["decode_tok_s"])
    mid = ordered[len(ordered) // 2]
    if len(ordered) % 2:
        return mid
    return {
        **mid,
        "decode_tok_s": statistics.mean(
            r["decode_tok_s"] for r in ordered[len(ordered) // 2 - 1 : len(ordered) // 2 + 1]
        ),
    }


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


if __name__ == "__main__":
    main()
