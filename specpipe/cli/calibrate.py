"""`specpipe-calibrate`: measure T(n)/T(1) for the configured target (and the
draft cost c), print the curve and the predicted speed-up per K at several
acceptance rates, save `calibration.json` and `calibration.png` in the run
folder, and refresh the cache that `budget=auto` reads.

It also times the curve at long contexts (1k, 4k, 8k, 16k cached positions, up to the model's
context; costmodel/context_curve.py), which `budget=auto` otherwise times in the middle of the
first run that reaches them: seconds to a minute, on a machine that may be busy then.

Same config and overrides as `specpipe` (model, draft, quant, kv, ...)
plus conf/calibrate.yaml's: `quick=true` measures 7 points instead of 33
(slow devices, big models); `contexts=false` skips the long-context curves.

Last, a short measured check (costmodel/check.py): `check_tokens` tokens of the configured prompt, plain
and then the configured drafter under budget=auto, twice each, so the prediction is printed beside what
this machine measures; `check=false` skips it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

ALPHAS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
KS = (0, 1, 2, 4, 8, 16, 32)


def main() -> None:
    from specpipe.cli.shell import hydra_main

    hydra_main("specpipe-calibrate", "calibrate", _task, interrupted="; the cached curve was not changed")


def _task(cfg) -> None:
    from specpipe.cli.shell import hydra_output_dir, print_result

    text = calibrate(cfg)
    print_result(
        "specpipe-calibrate", text, f"the calibration is saved in {hydra_output_dir() or 'outputs/calibration'}"
    )


def calibrate(cfg, out_dir: str | Path | None = None, log=None) -> str:
    """Measure, save and describe the device's speculation economics.

    Args:
        log: where each step's progress line goes as it starts (default: stderr), so a minute of timing
            is never a minute of silence.
    """
    from specpipe.cli.shell import hydra_output_dir
    from specpipe.config.config_groups import with_group
    from specpipe.costmodel.calibration import draft_cost, expected_speedup, verify_cost_curve
    from specpipe.costmodel.context_curve import context_curves
    from specpipe.engine.device import device
    from specpipe.run.session import Session

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    started = time.perf_counter()
    check = bool(cfg.check) and cfg.draft.name != "none"  # draft=none: nothing drafted, nothing to check
    steps = 3 + bool(cfg.contexts) + check

    def step(n: int, text: str) -> None:
        log(f"[calibrate {n}/{steps}, {time.perf_counter() - started:.0f} s] {text}")

    cfg = with_group(cfg, "budget", "fixed")  # calibration measures; it needs no budget of its own
    step(1, f"loading {cfg.model.name} and draft={cfg.draft.name}")
    session = Session(cfg)
    quick = bool(cfg.quick)
    lengths = "7 lengths" if quick else "every length 1-33"
    step(2, f"timing one forward over n tokens after 128 cached ones, {lengths}, fastest of 3 each")
    curve = verify_cost_curve(session.target, quick=quick, refresh=True)
    step(3, f"timing draft={session.drafter.name}'s cost per drafted token")
    c = draft_cost(session.drafter, session.target, quick=quick)
    ratio = curve["ratio"]
    if cfg.contexts:
        step(4, "timing the same curve after 1k, 4k, 8k, 16k cached positions (contexts=false skips it)")
    contexts = context_curves(session.target, refresh=True) if cfg.contexts else {}
    checked = None
    if check:
        from specpipe.costmodel.check import measured_check

        # two runs of plain and two drafted, each ~check_tokens plain steps at most: a cost said before it is paid
        cost = 4 * cfg.check_tokens * curve["t1_s"]
        said = f"about {cost:.0f} s" if cost >= 1 else "under a second"
        step(
            steps,
            f"measured check: {cfg.check_tokens} tokens of the prompt, plain then draft={session.drafter.name} "
            f"budget=auto, twice each ({said} plus prefills; check=false skips it)",
        )
        checked = measured_check(cfg, session.target, int(cfg.check_tokens))
    log(f"[calibrate] done in {time.perf_counter() - started:.0f} s")
    out = Path(out_dir or hydra_output_dir() or "outputs/calibration")
    out.mkdir(parents=True, exist_ok=True)
    dev = device()
    table = {a: {k: expected_speedup(a, k, c, ratio) for k in KS} for a in ALPHAS}
    (out / "calibration.json").write_text(
        json.dumps(
            {
                "target": session.target.info.name,
                "precision": session.target.info.precision,
                "device": dev,
                "t1_s": curve["t1_s"],
                "ratio": ratio,
                "draft": session.drafter.name,
                "draft_cost": c,
                "contexts": {str(n): v for n, v in contexts.items()},
                "predicted_speedup": {str(a): {str(k): v for k, v in row.items()} for a, row in table.items()},
                "check": dataclasses.asdict(checked) if checked is not None else None,
            },
            indent=2,
        )
    )
    _plot(
        ratio,
        table,
        out / "calibration.png",
        f"{session.target.info.name} ({session.target.info.precision}, {dev.get('blas', '?')})",
    )

    lines = [
        f"target {session.target.info.name} ({session.target.info.precision}) on {dev.get('mlx_device')} "
        f"BLAS={dev.get('blas', '?')}: one token {curve['t1_s'] * 1000:.1f} ms",
        "T(n)/T(1): " + "  ".join(f"{n}:{ratio[n]:.2f}" for n in (2, 3, 5, 9, 17, 33)),
        *[
            f"after {n} cached positions: one token {v['t1_s'] * 1000:.1f} ms, T(n)/T(1): "
            + "  ".join(f"{m}:{v['ratio'][m]:.2f}" for m in (2, 3, 5, 9, 17, 33))
            for n, v in contexts.items()
        ],
        f"draft={session.drafter.name}: cost per drafted token c = {c:.3f} x one target forward",
        "predicted decode speed-up over plain decoding, the cost model budget=auto uses:",
        "  rows: acceptance, the chance the target accepts each drafted token (the same at every position)",
        "  columns: K, tokens drafted per step (K = 0 is plain decoding); * the best K of the row",
        "  a drafter's real acceptance falls along its draft, so measured speed-ups sit below these:",
        '  specpipe-bench budget=auto "fixed_ks=[4,8]" (or specpipe-tune) measures them',
        "  acceptance " + "".join(f"{k:>7}" for k in KS),
    ]
    for a, row in table.items():
        best = max(row, key=lambda k: row[k])
        lines.append(f"  {a:10.0%} " + "".join(f"{row[k]:>6.2f}{'*' if k == best else ' '}" for k in KS))
    if checked is not None:
        lines += checked.lines(_prompt_label(cfg))
    lines.append(
        f"saved {out / 'calibration.json'} and {out / 'calibration.png'}; budget=auto now uses "
        + ("these curves" if contexts else "this curve")
    )
    return "\n".join(lines)


def _prompt_label(cfg) -> str:
    """`prompt=<name>` as composed (Hydra's choice), else the prompt's first words."""
    try:
        from hydra.core.hydra_config import HydraConfig

        name = HydraConfig.get().runtime.choices.get("prompt")
    except ValueError:  # called without Hydra (a test): no choices to read
        name = None
    if name:
        return f"prompt={name}"
    words = " ".join(str(cfg.prompt.text or "").split()[:4])
    return f"the prompt '{words}...'"


def _plot(ratio: dict, table: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    ns = sorted(ratio)
    left.plot(ns, [ratio[n] for n in ns], marker="o", label="measured T(n)/T(1)")
    left.plot(ns, ns, linestyle="--", color="grey", label="linear (no batching gain)")
    left.set(xlabel="tokens per forward n", ylabel="T(n) / T(1)", title="verify cost")
    left.legend()
    for a, row in table.items():
        right.plot(list(row), list(row.values()), marker="o", label=f"acceptance {a:.0%}")
    right.axhline(1.0, color="grey", linestyle="--")
    right.set(xlabel="K", ylabel="predicted speed-up", xscale="log", title="when speculation pays")
    right.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
