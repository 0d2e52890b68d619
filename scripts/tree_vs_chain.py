"""Chain vs token trees, A/B in one sitting: a float32 target (SmolLM2 default) + n-gram / lookahead, greedy.

    python scripts/tree_vs_chain.py [--suite code] [--limit 4] [--max-tokens 96] [--repeats 2] [--only NAME ...]
    python scripts/tree_vs_chain.py --model qwen2.5-coder-1.5b --limit 3 --only "chain K=8" "dynamic nodes=8 depth=8"

Per prompt and repeat the configurations run in rotating order over one loaded target: plain decoding
(draft=none), n-gram chains (K = 8, 16), n-gram trees of the same verify width, budget=auto for the chain
and the tree, and draft=lookahead trees (specpipe/trees/, specpipe/drafters/lookahead.py). Every output is
checked equal to plain decoding's. Prints per configuration: tokens per target forward, accepted length
(1 + accepted / steps), nodes verified per step, and the speed-up over plain as the geometric mean of the
per-prompt ratios of decode tok/s (the median repeat of each) and the worst prompt's. The "..., no guards"
rows (only by name in --only) run budget=auto on trees without its guards against thin evidence:

    python scripts/tree_vs_chain.py --suite prose --limit 4 --max-tokens 64 --repeats 3 --only \
        "auto tree (dynamic 16)" "auto tree (dynamic 16), no guards" \
        "lookahead auto tree (dynamic 16)" "lookahead auto tree (dynamic 16), no guards"
"""

import argparse
import json
import math
import os
import statistics
from pathlib import Path

from specpipe.engine.load.blas import preload_blas

blas = preload_blas()
import specpipe.trees.budget as tree_budget  # noqa: E402
from specpipe.budgets.auto import AutoBudget  # noqa: E402
from specpipe.budgets.fixed import FixedBudget  # noqa: E402
from specpipe.core.pipeline import SpeculativePipeline  # noqa: E402
from specpipe.core.stages.bonus import GreedyBonus  # noqa: E402
from specpipe.core.stages.compare import GreedyComparator  # noqa: E402
from specpipe.drafters.lookahead import LookaheadDrafter  # noqa: E402
from specpipe.drafters.ngram import NgramDrafter  # noqa: E402
from specpipe.drafters.none import NoneDrafter  # noqa: E402
from specpipe.engine.load.loader import load_engine  # noqa: E402
from specpipe.rollbacks.trim import TrimRollback  # noqa: E402
from specpipe.trees.shape import TreeShape  # noqa: E402
from specpipe.trees.step import TreeStep  # noqa: E402

DYN = lambda n, depth=8: TreeShape(kind="dynamic", nodes=n, depth=depth, branching=[4] * depth)  # noqa: E731

# name -> (drafter, budget, tree shape); budget an int K (fixed) or "auto". The tree rows verify the same
# width as the chain rows above them (K = n nodes: n + 1 fed positions).
CONFIGS = {
    "plain": (None, 1, None),
    "chain K=8": ("ngram", 8, None),
    "chain K=16": ("ngram", 16, None),
    "static [2,2,1,1,1,1,1,1]": ("ngram", 8, TreeShape(kind="static", branching=[2, 2, 1, 1, 1, 1, 1, 1])),
    "static [4,2,1,1,1,1,1,1]": ("ngram", 8, TreeShape(kind="static", branching=[4, 2, 1, 1, 1, 1, 1, 1])),
    "dynamic nodes=8 depth=8": ("ngram", 8, DYN(8)),
    "dynamic nodes=16 depth=8": ("ngram", 8, DYN(16)),
    "dynamic nodes=32 depth=16": ("ngram", 8, DYN(32, 16)),
    "auto chain": ("ngram", "auto", None),
    "auto tree (dynamic 16)": ("ngram", "auto", DYN(16)),
    "lookahead dynamic 8": ("lookahead", 8, DYN(8, 6)),
    "lookahead dynamic 16": ("lookahead", 8, DYN(16, 6)),
    "lookahead auto tree (dynamic 16)": ("lookahead", "auto", DYN(16, 6)),
}
# auto without its guards against thin evidence (trees/budget.py: MIN_GAIN / THIN_GAIN, no verify on a
# predicted gain within the estimates' error; PRIOR_FADES): the A/B of docs/benchmarks.md, session 14
UNGUARDED = {f"{name}, no guards": name for name in ("auto tree (dynamic 16)", "lookahead auto tree (dynamic 16)")}
CONFIGS.update({unguarded: CONFIGS[name] for unguarded, name in UNGUARDED.items()})


def run(target, name, spec, prompt, max_tokens):
    if name in UNGUARDED:
        return _unguarded(target, name, spec, prompt, max_tokens)
    kind, k, shape = spec
    rollback = TrimRollback()
    drafter = {None: NoneDrafter, "ngram": NgramDrafter, "lookahead": LookaheadDrafter}[kind]()
    if k == "auto":
        budget = AutoBudget()
        budget.prepare(target, drafter)  # the device's calibrated curve (cached) and the drafter's cost
    else:
        budget = FixedBudget(k=k)
    # fixed K: the shape alone sizes the tree (no cap); auto: the budget sizes it (specpipe/trees/budget.py)
    step = TreeStep(target, drafter, shape, rollback, budget=budget if k == "auto" else None) if shape else None
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), rollback, GreedyBonus(), tree_step=step)
    final = list(pipe.run(prompt, max_tokens, stop_ids=target.eos_token_ids))[-1]
    return final


def _unguarded(target, name, spec, prompt, max_tokens):
    """`run` with the tree sizer's guards off for this run only (module constants, read per step)."""
    saved = tree_budget.MIN_GAIN, tree_budget.THIN_GAIN, tree_budget.PRIOR_FADES
    tree_budget.MIN_GAIN = tree_budget.THIN_GAIN = -1.0
    tree_budget.PRIOR_FADES = False
    try:
        return run(target, UNGUARDED[name], spec, prompt, max_tokens)
    finally:
        tree_budget.MIN_GAIN, tree_budget.THIN_GAIN, tree_budget.PRIOR_FADES = saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--model", default="smollm2-135m", help="the target (float32); n-gram and lookahead need no draft model"
    )
    ap.add_argument("--suite", default="code")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", nargs="*", help="configuration names to run (plain is always run)")
    a = ap.parse_args()
    load_start = os.getloadavg()[0]
    target = load_engine(a.model, precision="float32")
    suite = Path(__file__).resolve().parents[1] / "specpipe" / "bench" / "suites" / f"{a.suite}.jsonl"
    prompts = [json.loads(line) for line in suite.read_text().splitlines() if line.strip()][: a.limit]
    # without --only: every configuration but the unguarded auto rows (they are for the guards' A/B)
    names = [n for n in CONFIGS if n == "plain" or (n in a.only if a.only else n not in UNGUARDED)]
    run(target, "plain", CONFIGS["plain"], target.encode_prompt("warm up", chat=True), 8)
    rows = {n: [] for n in names}  # per prompt: (tok/s median, tokens/forward, accepted length, nodes/step)
    for p_i, p in enumerate(prompts):
        ids = target.encode_prompt(p["prompt"], chat=True)
        runs = {n: [] for n in names}
        for r in range(a.repeats):
            order = names[(p_i + r) % len(names) :] + names[: (p_i + r) % len(names)]  # rotate: no config always first
            for n in order:
                runs[n].append(run(target, n, CONFIGS[n], ids, a.max_tokens))
        plain_ids = runs["plain"][0].token_ids
        for n in names:
            for f in runs[n]:
                assert f.token_ids == plain_ids, f"{n} on {p['id']}: output differs from plain decoding"
            s = [f.stats for f in runs[n]]
            rows[n].append(
                (
                    statistics.median(x.decode_tok_s for x in s),
                    s[0].tokens_per_forward,
                    s[0].acceptance_length,
                    s[0].tree_nodes_per_step or (s[0].drafted / s[0].steps if s[0].steps else 0),
                )
            )
        print(
            f"{p['id']}: {len(plain_ids)} tokens; " + ", ".join(f"{n} {rows[n][-1][0]:.1f}" for n in names), flush=True
        )
    print(
        f"\n{a.model} float32 ({blas.name}), suite {a.suite}, "
        f"{len(prompts)} prompts, {a.max_tokens} tokens max, "
        f"{a.repeats} repeats (median), every output == plain decoding's; "
        f"load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )
    print(
        "| configuration | tokens / target forward | accepted length | "
        "nodes verified / step | speed-up over plain (geo-mean) | worst prompt |"
    )
    print("|---|---|---|---|---|---|")
    for n in names:
        ratios = [r[0] / b[0] for r, b in zip(rows[n], rows["plain"])]
        ratio = math.exp(statistics.mean(math.log(x) for x in ratios))
        print(
            f"| {n} | {statistics.mean(r[1] for r in rows[n]):.2f} | {statistics.mean(r[2] for r in rows[n]):.2f} | "
            f"{statistics.mean(r[3] for r in rows[n]):.1f} | {ratio:.2f}x | {min(ratios):.2f}x |"
        )


if __name__ == "__main__":
    main()
