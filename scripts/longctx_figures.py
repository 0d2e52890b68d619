"""Long-context figures in one sitting: prefill, TTFT, decode speed-up and memory vs prompt length.

For each prompt of the `longctx` suite picked by --sizes (one question per
size, the "late" one), on one loaded target, interleaved per repeat (the
order flips every repeat; the median run of each row is kept):

- specpipe plain (draft=none), its prefill tok/s and TTFT beside mlx-lm's own
  `stream_generate` (the whole prompt through its generate_step prefill:
  chunks of 2,048) on the same model object;
- decode tok/s of draft=ngram budget=fixed (k=4) and budget=auto over plain;
- kv=full vs kv=quantized (8 and 4 bits), plain decoding: peak MLX memory
  (weights included) and the KV cache's own bytes per token.

Greedy throughout: every specpipe row must emit plain's tokens (checked).
Prints a Markdown table, asserts nothing about speed (a shared CPU is noisy).

    python scripts/longctx_figures.py                                  # SmolLM2, 1k 4k 8k, 64 tokens, 2 repeats
    python scripts/longctx_figures.py --model qwen2.5-coder-1.5b --sizes 1k 4k --repeats 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from specpipe.engine.load.blas import blas_info, preload_blas

preload_blas()

import mlx.core as mx  # noqa: E402
from hydra import compose, initialize_config_module  # noqa: E402

import specpipe.config  # noqa: E402,F401  (registers the schemas)
from specpipe.bench.records import load_suite  # noqa: E402
from specpipe.engine.load.loader import load_engine  # noqa: E402
from specpipe.events import RunFinished  # noqa: E402
from specpipe.session import Session  # noqa: E402

ROWS = {  # label -> overrides of the main config
    "plain": ["draft=none"],
    "ngram k=4": ["draft=ngram", "budget=fixed", "budget.k=4"],
    "ngram auto": ["draft=ngram", "budget=auto"],
    "plain kv=q8": ["draft=none", "kv=quantized", "kv.bits=8"],
    "plain kv=q4": ["draft=none", "kv=quantized", "kv.bits=4"],
}


def specpipe_run(session: Session, prompt_ids: list[int], max_tokens: int) -> dict:
    final = None
    for event in session.generate(prompt_ids, max_tokens):
        if isinstance(event, RunFinished):
            final = event
    s = final.stats
    return {
        "tokens": final.token_ids,
        "prefill_tok_s": s.prefill_tok_s,
        "ttft_s": s.ttft_s,
        "decode_tok_s": s.decode_tok_s,
        "peak_mib": s.peak_memory_bytes / 2**20,
        "kv_kib_per_token": s.kv_bytes_per_token / 1024,
        "acceptance": s.acceptance_rate,
    }


def mlx_lm_run(engine, prompt_ids: list[int], max_tokens: int) -> dict:
    from mlx_lm.generate import stream_generate

    mx.reset_peak_memory()
    t0 = time.perf_counter()
    tokens, ttft, last = [], 0.0, None
    for response in stream_generate(engine.model, engine.tokenizer, mx.array(prompt_ids), max_tokens=max_tokens):
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
        "kv_kib_per_token": 0.0,
        "acceptance": 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sizes", nargs="+", default=["1k", "4k", "8k"])
    parser.add_argument("--suite", default="longctx")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rows", nargs="+", default=list(ROWS) + ["mlx-lm"])
    parser.add_argument("--json", help="also write every run here (JSON lines)")
    args = parser.parse_args()

    engine = load_engine(args.model, precision="float32")
    with initialize_config_module(version_base=None, config_module="specpipe.conf"):
        sessions = {
            label: Session(
                compose("config", overrides=[f"model={args.model}", "quant=float32", *ROWS[label]]), target=engine
            )
            for label in args.rows
            if label in ROWS
        }
    prompts = {p["id"]: p["prompt"] for p in load_suite(args.suite)}
    print(
        f"# {args.model}, float32, {blas_info().name}, {args.max_tokens} tokens, {args.repeats} repeats (median), "
        f"order flipped per repeat"
    )
    print(f"# started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}", flush=True)
    print(
        "| prompt | tokens | row | prefill tok/s | TTFT s | decode tok/s | "
        "decode vs plain | acceptance | peak MiB | KV KiB/token |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    out = open(args.json, "w") if args.json else None
    for size in args.sizes:
        pid = f"longctx-{size}-late"
        ids = engine.encode_prompt(prompts[pid], chat=True)
        runs: dict[str, list[dict]] = {label: [] for label in args.rows}
        for rep in range(args.repeats):
            order = args.rows if rep % 2 == 0 else args.rows[::-1]
            for label in order:
                kv_session = sessions.get(label)
                engine.kv = kv_session.kv if kv_session else None  # the engine holds the session's KV policy
                run = (
                    specpipe_run(kv_session, ids, args.max_tokens)
                    if kv_session
                    else mlx_lm_run(engine, ids, args.max_tokens)
                )
                runs[label].append(run)
                if out:
                    out.write(
                        json.dumps(
                            {
                                "prompt": pid,
                                "row": label,
                                "repeat": rep,
                                **{k: v for k, v in run.items() if k != "tokens"},
                            }
                        )
                        + "\n"
                    )
                    out.flush()
        plain = _median(runs["plain"]) if "plain" in runs else None
        for label in args.rows:
            m = _median(runs[label])
            same = (
                ""
                if plain is None or m["tokens"] == plain["tokens"] or label == "mlx-lm"
                else " (tokens differ from plain!)"
            )
            if label.startswith("plain kv="):
                same = "" if m["tokens"] == plain["tokens"] else " (other tokens: lossy KV)"
            speedup = f"{m['decode_tok_s'] / plain['decode_tok_s']:.2f}x" if plain else "-"
            print(
                f"| {pid} | {len(ids)} | {label}{same} | {m['prefill_tok_s']:.0f} | {m['ttft_s']:.2f} | "
                f"{m['decode_tok_s']:.1f} | "
                f"{speedup} | {m['acceptance']:.0%} | {m['peak_mib']:.0f} | {m['kv_kib_per_token']:.1f} |",
                flush=True,
            )


def _median(runs: list[dict]) -> dict:
    """The run with the median decode speed (its other figures come with it, from one run)."""
    ordered = sorted(runs, key=lambda r: r["decode_tok_s"])
    return (
        ordered[len(ordered) // 2]
        if len(ordered) % 2
        else {
            **ordered[len(ordered) // 2],
            **{
                k: statistics.mean(r[k] for r in ordered[len(ordered) // 2 - 1 : len(ordered) // 2 + 1])
                for k in ("prefill_tok_s", "ttft_s", "decode_tok_s", "peak_mib")
            },
        }
    )


if __name__ == "__main__":
    main()
