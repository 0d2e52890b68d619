"""A/B in one sitting: budget=auto on trees with and without its guards against thin evidence
(trees/budget.py: MIN_GAIN / THIN_GAIN, a verify predicted to gain under 3% is not taken and under 10%
waits for a well timed T(1); PRIOR_FADES, the prior's weight fades as evidence comes in), SmolLM2
float32 + n-gram / lookahead, greedy; every output checked equal to plain decoding's.

    OPENBLAS_NUM_THREADS=1 python scripts/tree_guards_ab.py --suite prose --limit 4 --max-tokens 64 --repeats 3

"Without" sets both thresholds below any gain and keeps the prior's weight fixed, for that run only
(module constants read per step).
"""

import argparse
import json
import math
import statistics
from pathlib import Path

import tree_vs_chain as tvc

import specpipe.trees.budget as tree_budget

ROWS = {  # name -> (tree_vs_chain configuration, guards on)
    "plain": ("plain", True),
    "n-gram auto tree, guards": ("auto tree (dynamic 16)", True),
    "n-gram auto tree, no guards": ("auto tree (dynamic 16)", False),
    "lookahead auto tree, guards": ("lookahead auto tree (dynamic 16)", True),
    "lookahead auto tree, no guards": ("lookahead auto tree (dynamic 16)", False),
}


def run(target, name, ids, max_tokens):
    config, guards = ROWS[name]
    saved = tree_budget.MIN_GAIN, tree_budget.THIN_GAIN, tree_budget.PRIOR_FADES
    if not guards:
        tree_budget.MIN_GAIN = tree_budget.THIN_GAIN = -1.0
        tree_budget.PRIOR_FADES = False
    try:
        return tvc.run(target, config, tvc.CONFIGS[config], ids, max_tokens)
    finally:
        tree_budget.MIN_GAIN, tree_budget.THIN_GAIN, tree_budget.PRIOR_FADES = saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="prose")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    target = tvc.load_engine("smollm2-135m", precision="float32")
    suite = Path(tvc.__file__).resolve().parents[1] / "specpipe" / "bench" / "suites" / f"{a.suite}.jsonl"
    prompts = [json.loads(line) for line in suite.read_text().splitlines() if line.strip()][: a.limit]
    names = list(ROWS)
    run(target, "plain", target.encode_prompt("warm up", chat=True), 8)
    rows = {n: [] for n in names}
    for p_i, p in enumerate(prompts):
        ids = target.encode_prompt(p["prompt"], chat=True)
        runs = {n: [] for n in names}
        for r in range(a.repeats):
            order = names[(p_i + r) % len(names) :] + names[: (p_i + r) % len(names)]
            for n in order:
                runs[n].append(run(target, n, ids, a.max_tokens))
        plain_ids = runs["plain"][0].token_ids
        for n in names:
            assert all(f.token_ids == plain_ids for f in runs[n]), f"{n} on {p['id']}: output differs from plain"
            s = [f.stats for f in runs[n]]
            rows[n].append((statistics.median(x.decode_tok_s for x in s), s[0].tokens_per_forward))
        print(f"{p['id']}: " + ", ".join(f"{n} {rows[n][-1][0]:.1f}" for n in names), flush=True)
    print(f"\nsmollm2-135m float32 ({tvc.blas.name}), suite {a.suite}, {len(prompts)} prompts, {a.repeats} repeats")
    print("| configuration | tokens / target forward | speed-up over plain (geo-mean) | worst prompt |")
    print("|---|---|---|---|")
    for n in names:
        ratios = [r[0] / b[0] for r, b in zip(rows[n], rows["plain"])]
        geo = math.exp(statistics.mean(math.log(x) for x in ratios))
        tpf = statistics.mean(r[1] for r in rows[n])
        print(f"| {n} | {tpf:.2f} | {geo:.2f}x | {min(ratios):.2f}x |")


if __name__ == "__main__":
    main()
