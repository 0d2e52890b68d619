"""Side-by-side figures for drafters without a second model on one target:
the trained MTP head, layer skip at two depths and n-gram, on code prompts.

Contract: `python scripts/compare_drafters.py [--max-tokens 64] [--k 4] [--prompts 3]`
prints a Markdown table (acceptance by draft position, tokens per target
forward, acceptance rate) built from each run's RunFinished stats. Greedy
only; it also checks every drafter's tokens equal draft=none's. Numbers, no
assertions on timing.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from typing import Any

from specpipe.engine.load.blas import preload_blas

preload_blas()  # before mlx


def main() -> None:
    from specpipe.budgets.fixed import FixedBudget
    from specpipe.core.pipeline import SpeculativePipeline
    from specpipe.core.stages.bonus import GreedyBonus
    from specpipe.core.stages.compare import GreedyComparator
    from specpipe.drafters.layerskip import LayerSkipDrafter
    from specpipe.drafters.mtp import MtpDrafter
    from specpipe.drafters.ngram import NgramDrafter
    from specpipe.drafters.none import NoneDrafter
    from specpipe.engine.load.loader import load_engine
    from specpipe.rollbacks.trim import TrimRollback

    parser = argparse.ArgumentParser(description="MTP head, layer skip and n-gram side by side on SmolLM2 (greedy)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4, help="fixed draft budget")
    parser.add_argument("--prompts", type=int, default=3, help="code prompts to run")
    args = parser.parse_args()
    max_tokens, k, n_prompts = args.max_tokens, args.k, args.prompts
    target = load_engine("smollm2-135m", precision="float32")
    lines = resources.files("specpipe.bench.suites").joinpath("code.jsonl").read_text().splitlines()
    prompts = [json.loads(line) for line in lines[:n_prompts]]
    n_layers = len(target.model.model.layers)
    drafters = {
        "mtp (trained head)": lambda: MtpDrafter(target=target),
        f"layerskip depth {n_layers // 4}": lambda: LayerSkipDrafter(target=target, depth=n_layers // 4),
        f"layerskip depth {n_layers // 2}": lambda: LayerSkipDrafter(target=target, depth=n_layers // 2),
        "ngram": lambda: NgramDrafter(),
    }

    def run(drafter, ids, budget):
        pipe = SpeculativePipeline(
            target, drafter, FixedBudget(k=budget), GreedyComparator(), TrimRollback(), GreedyBonus()
        )
        return list(pipe.run(ids, max_tokens, stop_ids=set()))[-1]

    encoded = [target.encode_prompt(p["prompt"], chat=True) for p in prompts]
    baselines = [run(NoneDrafter(), ids, 1).token_ids for ids in encoded]
    print(
        f"SmolLM2-135M float32, greedy, K={k}, {max_tokens} tokens x {len(prompts)} "
        f"code prompts ({', '.join(p['id'] for p in prompts)})\n"
    )
    print("| drafter | acceptance by position 1..K | tokens / target forward | acceptance rate | drafter forwards |")
    print("|---|---|---|---|---|")
    for label, make in drafters.items():
        totals: dict[str, Any] = {
            "accepted": 0,
            "drafted": 0,
            "forwards": 0,
            "tokens": 0,
            "by_pos": [0.0] * k,
            "draft_forwards": 0,
        }
        for ids, baseline in zip(encoded, baselines):
            final = run(make(), ids, k)
            assert final.token_ids == baseline, f"{label}: output differs from draft=none"
            s = final.stats
            totals["accepted"] += s.accepted
            totals["drafted"] += s.drafted
            totals["tokens"] += s.generated_tokens
            totals["forwards"] += s.target_forwards
            totals["draft_forwards"] += s.draft_forwards
            for i, a in enumerate(s.acceptance_by_position[:k]):
                totals["by_pos"][i] += a / len(encoded)
        by_pos = " ".join(f"{a:.2f}" for a in totals["by_pos"])
        rate = totals["accepted"] / max(totals["drafted"], 1)
        print(
            f"| {label} | {by_pos} | {totals['tokens'] / max(totals['forwards'], 1):.2f} | "
            f"{rate:.2f} | {totals['draft_forwards']} |"
        )


if __name__ == "__main__":
    main()
