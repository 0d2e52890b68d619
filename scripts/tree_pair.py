"""Chain vs token trees with a draft model, A/B in one sitting: Qwen2.5-Coder-1.5B target + 0.5B draft
(float32), greedy, with mlx-lm's speculative decoding on the same model objects.

    python scripts/tree_pair.py [--suite code] [--skip 0] [--limit 2] [--max-tokens 64] [--repeats 1] [--mlx-ks 4]

Per prompt and repeat the configurations run in rotating order: plain decoding, chains (fixed K, auto),
trees (draft=model proposes its greedy chain with the top-k siblings of each token; fixed shape and
budget=auto sizing), the same with a prompt lookup in front of the draft model (`draft.lookup_min_n=3`:
where the context's last 3+ tokens occurred earlier, what followed them is the draft, no draft forward),
mlx-lm plain and mlx-lm with num_draft_tokens K. Our draft head is cut to the 32k most frequent ids plus the
context's by default (draft.vocab, drafters/draft_vocab.py); the "whole draft head" rows score every id, as
mlx-lm's draft does. Every output, ours and mlx-lm's,
is checked equal to plain decoding's. Speed-ups: ours over our plain, mlx-lm's over its own plain
(geometric mean over prompts of the median repeat's decode tok/s).
"""

import argparse
import json
import math
import os
import statistics
from pathlib import Path

from specpipe.engine.load.blas import preload_blas

blas = preload_blas()
from specpipe.bench.measure import measure_mlx_lm  # noqa: E402
from specpipe.budgets.auto import AutoBudget  # noqa: E402
from specpipe.budgets.fixed import FixedBudget  # noqa: E402
from specpipe.core.pipeline import SpeculativePipeline  # noqa: E402
from specpipe.core.stages.bonus import GreedyBonus  # noqa: E402
from specpipe.core.stages.compare import GreedyComparator  # noqa: E402
from specpipe.drafters.model import ModelDrafter  # noqa: E402
from specpipe.drafters.none import NoneDrafter  # noqa: E402
from specpipe.engine.load.loader import load_engine  # noqa: E402
from specpipe.rollbacks.trim import TrimRollback  # noqa: E402
from specpipe.trees.shape import TreeShape  # noqa: E402
from specpipe.trees.step import TreeStep  # noqa: E402

DYN = lambda n, depth, width=3: TreeShape(kind="dynamic", nodes=n, depth=depth, branching=[width] * depth)  # noqa: E731

# name -> (budget: int K or "auto", tree shape or None, lookup_min_n, draft.vocab); None budget: plain decoding.
# draft.vocab None: the default (the draft head cut to 32768 rows + the context's); 0: the whole head, as mlx-lm
CONFIGS = {
    "plain": (None, None, 0, None),
    "chain K=4": (4, None, 0, None),
    "chain K=8": (8, None, 0, None),
    "chain auto": ("auto", None, 0, None),
    "chain K=8, whole draft head": (8, None, 0, 0),
    "chain auto, whole draft head": ("auto", None, 0, 0),
    "tree dynamic nodes=8 depth=4": (8, DYN(8, 4), 0, None),
    "tree dynamic nodes=16 depth=6": (8, DYN(16, 6), 0, None),
    "tree auto (dynamic 16, depth <= 8)": ("auto", DYN(16, 8), 0, None),
    "lookup + chain K=8": (8, None, 3, None),
    "lookup + chain auto": ("auto", None, 3, None),
    "lookup + tree dynamic nodes=16 depth=6": (8, DYN(16, 6), 3, None),
}


def run(target, draft, spec, prompt, max_tokens):
    k, shape, lookup, vocab = spec
    rollback = TrimRollback()
    if k is None:
        drafter, budget = NoneDrafter(), FixedBudget(k=1)
    else:
        drafter = ModelDrafter(
            target=target, load=lambda **_: draft, model="qwen2.5-coder-0.5b", lookup_min_n=lookup, vocab=vocab
        )
        budget = AutoBudget() if k == "auto" else FixedBudget(k=k)
        budget.prepare(target, drafter)
    step = TreeStep(target, drafter, shape, rollback, budget=budget if k == "auto" else None) if shape else None
    pipe = SpeculativePipeline(target, drafter, budget, GreedyComparator(), rollback, GreedyBonus(), tree_step=step)
    f = list(pipe.run(prompt, max_tokens, stop_ids=target.eos_token_ids))[-1]
    s = f.stats
    return f.token_ids, s.decode_tok_s, s.tokens_per_forward, s.acceptance_length, s.tree_nodes_per_step


def run_mlx(target, draft, k, prompt, max_tokens):
    r = measure_mlx_lm(target.model, target.tokenizer, prompt, max_tokens, draft.model if k else None, k)
    return r["token_ids"], r["decode_tok_s"], 0.0, 0.0, 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="code")
    ap.add_argument("--skip", type=int, default=0, help="start at this prompt of the suite (split a suite over cores)")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--mlx-ks", type=int, nargs="*", default=[4])
    ap.add_argument("--no-mlx", action="store_true", help="skip mlx-lm's rows, its plain decoding too")
    ap.add_argument("--only", nargs="*", help="configuration names to run (plain is always run)")
    a = ap.parse_args()
    load_start = os.getloadavg()[0]
    target = load_engine("qwen2.5-coder-1.5b", precision="float32")
    draft = load_engine("qwen2.5-coder-0.5b", precision="float32")
    suite = Path(__file__).resolve().parents[1] / "specpipe" / "bench" / "suites" / f"{a.suite}.jsonl"
    prompts = [json.loads(line) for line in suite.read_text().splitlines() if line.strip()][a.skip : a.skip + a.limit]
    ours = [n for n in CONFIGS if n == "plain" or not a.only or n in a.only]
    mlx = [] if a.no_mlx else ["mlx-lm plain"] + [f"mlx-lm K={k}" for k in a.mlx_ks]
    names = ours + mlx
    run(target, draft, CONFIGS["plain"], target.encode_prompt("warm up", chat=True), 4)
    rows = {n: [] for n in names}
    for p_i, p in enumerate(prompts):
        ids = target.encode_prompt(p["prompt"], chat=True)
        runs = {n: [] for n in names}
        for r in range(a.repeats):
            order = names[(p_i + r) % len(names) :] + names[: (p_i + r) % len(names)]
            for n in order:
                if n in CONFIGS:
                    runs[n].append(run(target, draft, CONFIGS[n], ids, a.max_tokens))
                else:
                    k = 0 if n == "mlx-lm plain" else int(n.split("=")[1])
                    runs[n].append(run_mlx(target, draft, k, ids, a.max_tokens))
        plain_ids = runs["plain"][0][0]
        for n in names:
            for got in runs[n]:
                assert got[0] == plain_ids, f"{n} on {p['id']}: output differs from plain decoding"
            rows[n].append((statistics.median(x[1] for x in runs[n]), *runs[n][0][2:]))
        print(
            f"{p['id']}: {len(plain_ids)} tokens; " + ", ".join(f"{n} {rows[n][-1][0]:.2f}" for n in names), flush=True
        )
    print(
        f"\nQwen2.5-Coder-1.5B + 0.5B draft, float32 ({blas.name}), suite {a.suite}, {len(prompts)} prompts, "
        f"{a.max_tokens} tokens max, {a.repeats} repeat(s) (median), every output == plain decoding's; "
        f"load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )
    print(
        "| configuration | tokens / target forward | accepted length | nodes verified / step | "
        "decode tok/s (geo-mean) | speed-up (geo-mean) |"
    )
    print("|---|---|---|---|---|---|")
    for n in names:
        base = rows["mlx-lm plain" if n.startswith("mlx-lm") else "plain"]
        ratio = math.exp(statistics.mean(math.log(r[0] / b[0]) for r, b in zip(rows[n], base)))
        tpf = statistics.mean(r[1] for r in rows[n])
        tok_s = math.exp(statistics.mean(math.log(r[0]) for r in rows[n]))  # absolute: the engines' plains differ
        print(
            f"| {n} | {tpf:.2f} | {statistics.mean(r[2] for r in rows[n]):.2f} | "
            f"{statistics.mean(r[3] for r in rows[n]):.1f} | {tok_s:.2f} | {ratio:.2f}x |"
        )


if __name__ == "__main__":
    main()
