"""Per-round cost of `rollback=checkpoint` vs `rollback=recompute` on a hybrid model.

Prints figures, asserts nothing (a shared CPU is noisy: compare ratios within
one run). One round = before_forward + verify forward of [last, *K drafts] +
rollback keeping `n` accepted drafts; the cache is reset to the same
prefilled prompt between rounds, outside the timer. Acceptance is simulated
by n_drop = K - n: a rollback's cost depends on how many positions are kept,
not on which tokens they are.

The model is a random-weight qwen3_next built by specpipe/engine/load/tiny.py with
the overrides below (~100M parameters: 9 Gated DeltaNet + 3 attention layers);
its numbers say nothing about text quality, only about rollback cost.

    python scripts/bench_rollback.py                # K = 4 8 16 32, 5 reps
    python scripts/bench_rollback.py --ks 4 8 --reps 3 --arch nemotron_h
"""

from __future__ import annotations

import argparse
import statistics
import time

try:
    from specpipe.engine.load.blas import preload_blas

    preload_blas()
except ImportError:  # pragma: no cover
    pass

import mlx.core as mx

from specpipe.core.stages.verify import verify
from specpipe.engine.engine import Capture
from specpipe.engine.load.loader import load_engine
from specpipe.rollbacks import layers as cache_layers
from specpipe.rollbacks.checkpoint import CheckpointRollback
from specpipe.rollbacks.recompute import RecomputeRollback

# ~100M parameters, most of them in the layers (vocab is the tiny 259-token one).
OVERRIDES = {
    "qwen3_next": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        full_attention_interval=4,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        linear_num_value_heads=16,
        linear_num_key_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
    ),
    "nemotron_h": dict(
        hidden_size=768,
        intermediate_size=3072,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        mamba_num_heads=24,
        mamba_head_dim=64,
        ssm_state_size=64,
        hybrid_override_pattern=["M", "-", "M", "*", "-", "M", "-", "M", "*", "-", "M", "-", "M", "-"],
    ),
}
STRATEGIES = {"checkpoint": CheckpointRollback, "recompute": RecomputeRollback}


def snapshot(cache: list):
    layers = cache_layers.split(cache)
    return [list(leaf.cache) for leaf in layers.recurrent], [leaf.offset for leaf in layers.attention]


def reset(cache: list, saved) -> None:
    states, offsets = saved
    layers = cache_layers.split(cache)
    for leaf, slots in zip(layers.recurrent, states):
        leaf.cache = list(slots)
    for leaf, offset in zip(layers.attention, offsets):
        leaf.trim(leaf.offset - offset)


def one_round(engine, cache, strategy, k: int, n: int, draft_ids: list[int]) -> tuple[float, float]:
    """(wall, CPU) seconds for before_forward + verify + rollback keeping n of k drafts."""
    w0, c0 = time.perf_counter(), time.process_time()
    states = strategy.before_forward(cache)
    verify(engine, cache, draft_ids[0], draft_ids[1 : k + 1], Capture(states=states) if states is not None else None)
    strategy.rollback(cache, k - n, engine=engine, fed_ids=draft_ids[: k + 1])
    mx.eval([leaf.cache for leaf in cache_layers.split(cache).recurrent])
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="qwen3_next", choices=sorted(OVERRIDES))
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    args = ap.parse_args()

    engine = load_engine("tiny-random", precision="float32", arch=args.arch, tiny=OVERRIDES[args.arch])
    print(f"model: random {args.arch}, {engine.info.parameters / 1e6:.0f}M parameters, float32, {mx.default_device()}")
    prompt = [(7 * i) % 250 + 3 for i in range(args.prompt_tokens)]
    cache = engine.make_cache()
    engine.prefill(prompt, cache)
    saved = snapshot(cache)
    state_bytes = sum(cache_layers.slot_bytes(s) for s in saved[0])
    print(f"recurrent state: {state_bytes / 2**20:.2f} MiB ({len(saved[0])} layers); prompt {len(prompt)} tokens\n")

    print("wall / CPU ms per round (median); peak snapshot MiB; tokens recomputed")
    print("   K  accepted   checkpoint wall/CPU   recompute wall/CPU   ckpt MiB  recomp MiB  recomputed")
    for k in args.ks:
        draft_ids = [(11 * i) % 250 + 3 for i in range(k + 1)]
        accepted = sorted({0, k // 4, k // 2, 3 * k // 4, k - 1, k})
        strategies = {name: cls() for name, cls in STRATEGIES.items()}
        for strategy in strategies.values():  # warm-up: compiles this K's shapes
            one_round(engine, cache, strategy, k, 0, draft_ids)
            reset(cache, saved)
        samples: dict[tuple, list] = {}
        for n in accepted:
            for rep in range(args.reps):
                # Alternate the order so both strategies see the same machine load.
                order = list(strategies.items())[:: 1 if rep % 2 == 0 else -1]
                for name, strategy in order:
                    samples.setdefault((name, n), []).append(one_round(engine, cache, strategy, k, n, draft_ids))
                    reset(cache, saved)
        wall = {key: statistics.median(s[0] for s in v) * 1e3 for key, v in samples.items()}
        cpu = {key: statistics.median(s[1] for s in v) * 1e3 for key, v in samples.items()}
        peak = {name: s.peak_bytes / 2**20 for name, s in strategies.items()}
        for n in accepted:
            print(
                f"{k:4d}  {n:8d}   {wall['checkpoint', n]:8.1f} /{cpu['checkpoint', n]:7.1f}"
                f"   {wall['recompute', n]:8.1f} /{cpu['recompute', n]:7.1f}"
                f"   {peak['checkpoint']:8.1f}  {peak['recompute']:10.1f}  {n + 1 if n < k else 0:10d}"
            )
        wins = [n for n in accepted if cpu["recompute", n] < cpu["checkpoint", n]]
        print(f"      recompute cheaper (CPU time) at accepted = {wins or 'never'} of {k}\n")


if __name__ == "__main__":
    main()
