"""A/B: the engine seam (this tree) against a tree without it, interleaved in one sitting.

    git worktree add /tmp/before e1fab75
    python scripts/ab_seam.py --before /tmp/before [--rounds 3 --reps 3 --tokens 64]

Each round runs, per group of cases (SmolLM2-135M; a ~100M random Qwen3-Next
hybrid), one worker process on each tree, the order alternating by round;
a worker loads the models once and, per case, runs one warm-up generation
and `reps` timed ones, keeping the best decode tok/s (tokens after the
prefill / time from PrefillDone to RunFinished; on a shared machine the best
of a few is the run least slowed by other work). Both trees must emit the same tokens
(checked), so both do the same work. Prints per case the after/before ratio
of each round and their median. Cases: draft=none (the fast path), n-gram,
self-draft and an MTP head (hidden states) with trim on SmolLM2; n-gram with
checkpoint / recompute / auto and self-draft with checkpoint (draft-cache
captures) on the hybrid. Float32, greedy, fixed K.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
GROUPS = {
    "smollm2": ["none-trim", "ngram-trim", "self-trim", "mtp-trim"],
    "hybrid": ["none-recompute", "ngram-checkpoint", "ngram-recompute", "ngram-auto", "self-checkpoint"],
}
HYBRID = dict(  # scripts/bench_rollback.py's ~100M Qwen3-Next
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
)
K = 4


def worker(group: str, reps: int, tokens: int) -> None:
    """Runs in a subprocess whose `specpipe` is the tree under test; prints one JSON line per case."""
    import tempfile
    import time

    try:  # the tree under test may predate the layered layout (core/, engine/load/)
        from specpipe.engine.load.blas import preload_blas
    except ImportError:
        from specpipe.engine.blas import preload_blas

    preload_blas()  # before mlx.core, as the console scripts do
    import mlx.core as mx

    import specpipe
    from specpipe.budgets.fixed import FixedBudget
    from specpipe.drafters.model import ModelDrafter
    from specpipe.drafters.mtp import MtpDrafter
    from specpipe.drafters.mtp_head import new_head, save_head
    from specpipe.drafters.ngram import NgramDrafter
    from specpipe.drafters.none import NoneDrafter
    from specpipe.events import PrefillDone, RunFinished
    from specpipe.rollbacks.auto import AutoRollback
    from specpipe.rollbacks.checkpoint import CheckpointRollback
    from specpipe.rollbacks.recompute import RecomputeRollback
    from specpipe.rollbacks.trim import TrimRollback

    try:
        from specpipe.core.pipeline import SpeculativePipeline
        from specpipe.core.stages.bonus import GreedyBonus
        from specpipe.core.stages.compare import GreedyComparator
        from specpipe.engine.introspect import llama_parts
        from specpipe.engine.load.loader import load_engine
    except ImportError:
        from specpipe.engine.loader import load_engine
        from specpipe.pipeline import SpeculativePipeline
        from specpipe.stages.bonus import GreedyBonus
        from specpipe.stages.compare import GreedyComparator

        from specpipe.drafters.layerskip import llama_parts

    if group == "smollm2":
        target = load_engine("smollm2-135m", precision="float32")
        prompt = target.encode_prompt("def fibonacci(n):\n    if n < 2:\n        return n\n", chat=False)
    else:
        target = load_engine("tiny-random", precision="float32", arch="qwen3_next", tiny=HYBRID)
        prompt = [(7 * i) % 250 + 3 for i in range(48)]
    rollbacks = {
        "trim": TrimRollback,
        "checkpoint": CheckpointRollback,
        "recompute": RecomputeRollback,
        "auto": AutoRollback,
    }

    def drafter_for(kind: str):
        if kind == "none":
            return NoneDrafter()
        if kind == "ngram":
            return NgramDrafter(min_n=1, max_n=3)
        if kind == "self":
            return ModelDrafter(target=target, load=None, model="self")
        folder = Path(tempfile.mkdtemp())
        mx.random.seed(0)
        head, _ = new_head(llama_parts(target.model, "mtp")[0])
        save_head(head, folder, {"target": {"name": target.info.name, "sha256": target.info.sha256}})
        return MtpDrafter(target=target, head=str(folder))

    for case in GROUPS[group]:
        kind, strategy = case.split("-")
        drafter = drafter_for(kind)
        speeds, ids = [], None
        for rep in range(reps + 1):  # the first is a warm-up
            pipe = SpeculativePipeline(
                target, drafter, FixedBudget(k=K), GreedyComparator(), rollbacks[strategy](), GreedyBonus()
            )
            t_prefill = None
            for event in pipe.run(prompt, tokens, stop_ids=set()):
                if isinstance(event, PrefillDone):
                    t_prefill = time.perf_counter()
                elif isinstance(event, RunFinished):
                    elapsed = time.perf_counter() - t_prefill
                    ids = event.token_ids
            if rep:
                speeds.append(len(ids) / elapsed)
        print(
            json.dumps(
                {"case": case, "tok_s": max(speeds), "ids": ids, "tree": str(Path(specpipe.__file__).parents[1])}
            ),
            flush=True,
        )


def run_worker(tree: Path, group: str, reps: int, tokens: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(  # stderr shown on failure below
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            group,
            "--reps",
            str(reps),
            "--tokens",
            str(tokens),
            "--cases",
            ",".join(GROUPS[group]),
        ],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert all(Path(r["tree"]).resolve() == tree.resolve() for r in rows), (
        f"worker imported another specpipe: {rows[0]['tree']}"
    )
    return {r["case"]: r for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="a checkout without the seam (e.g. main at e1fab75)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--groups", default=",".join(GROUPS))
    ap.add_argument("--cases", help="comma-separated subset, e.g. ngram-checkpoint,self-checkpoint")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cases:
        for group in GROUPS:
            GROUPS[group] = [c for c in GROUPS[group] if c in args.cases.split(",")]
    if args.worker:
        return worker(args.worker, args.reps, args.tokens)
    groups = [g for g in args.groups.split(",") if GROUPS[g]]
    trees = {"before": args.before, "after": HERE}
    ratios: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for group in groups:
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            got = {name: run_worker(trees[name], group, args.reps, args.tokens) for name in order}
            for case in GROUPS[group]:
                b, a = got["before"][case], got["after"][case]
                assert a["ids"] == b["ids"], f"{case}: the trees emitted different tokens"
                ratios.setdefault(case, []).append(a["tok_s"] / b["tok_s"])
                print(
                    f"round {r + 1} {case:18s} before {b['tok_s']:7.1f} tok/s  after {a['tok_s']:7.1f} tok/s  "
                    f"after/before {a['tok_s'] / b['tok_s']:.3f}",
                    flush=True,
                )
    print("\nafter/before decode tok/s, median of rounds (1.00 = as fast):")
    for case, rs in ratios.items():
        print(f"  {case:18s} {statistics.median(rs):.3f}   rounds: {' '.join(f'{x:.3f}' for x in rs)}")


if __name__ == "__main__":
    main()
