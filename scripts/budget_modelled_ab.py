"""`auto` vs fixed K with the timing noise taken out: each run priced by a calibrated verify curve.

    python scripts/budget_modelled_ab.py CURVE.json suite=code limit=12 max_tokens=96 budget=auto

CURVE.json: a calibration file from <specpipe cache>/calibration/ (its "ratio", T(n)/T(1)). Every path
generates for real (the decisions see this machine's timings); its time is then the sum over steps of
T(fed)/T(1), plain decoding's is one per token. To compare two versions of `auto`, run this in a
worktree of each. Prints per prompt and the suite's geo-mean, and auto / best fixed K.
"""

from specpipe.engine.load.blas import preload_blas

preload_blas()

import json
import math
import sys

from hydra import compose, initialize_config_module

import specpipe.config  # noqa: F401  (registers the config schemas)
from specpipe.bench.harness import _shared_target, session_config, with_budget
from specpipe.bench.records import load_suite
from specpipe.budgets.fixed import FixedBudget
from specpipe.events import RunFinished, Verified
from specpipe.session import Session


def main() -> None:
    curve = {int(n): r for n, r in json.load(open(sys.argv[1]))["ratio"].items()}
    with initialize_config_module("specpipe.conf", version_base=None):
        cfg = compose("bench", overrides=sys.argv[2:])
    spec = Session(session_config(cfg, cfg.draft), target=_shared_target(cfg))
    paths = {"auto": spec, **{f"K={k}": with_budget(spec, FixedBudget(k=k)) for k in (4, 8, 16)}}
    prompts = load_suite(cfg.suite.name, cfg.suite.path, cfg.limit)

    def encode(prompt):
        return spec.target.encode_prompt(prompt["prompt"], cfg.suite.chat, cfg.suite.system)

    list(spec.generate(encode(prompts[0]), max_tokens=16))  # warm-up, as specpipe-bench does
    speedups: dict[str, list[float]] = {name: [] for name in paths}
    for prompt in prompts:
        row = []
        for name, session in paths.items():
            cost, tokens = 0.0, 0
            for event in session.generate(encode(prompt), max_tokens=cfg.max_tokens):
                if isinstance(event, Verified):
                    fed = len(event.accepted_ids) + len(event.rejected_ids) + 1
                    cost += curve[min(fed, max(curve))]
                elif isinstance(event, RunFinished):
                    tokens = event.stats.generated_tokens
            speedups[name].append(tokens / cost if cost else 1.0)
            row.append(f"{name} {speedups[name][-1]:.2f}x")
        print(prompt["id"], " ".join(row), flush=True)
    geo = {name: math.exp(sum(map(math.log, v)) / len(v)) for name, v in speedups.items()}
    best = max((name for name in geo if name != "auto"), key=geo.__getitem__)
    print(
        cfg.suite.name,
        " ".join(f"{name} {v:.3f}x" for name, v in geo.items()),
        f"-> auto / best fixed ({best}) {geo['auto'] / geo[best]:.3f}",
    )


if __name__ == "__main__":
    main()
