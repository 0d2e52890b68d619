"""The README's first command (`specpipe` on the embedded SmolLM2) with several BLAS choices,
interleaved in one sitting; prints medians and ratios to the first side.

    python scripts/measure_quickstart.py [repeats] [side ...]

Sides are SPECPIPE_BLAS values ("none" = MLX's reference BLAS, "mkl", "openblas", a path) or
"default" (what a user gets); the default sides are `none default`. Each run is a fresh `specpipe`
process (as a user runs it). Figures come from each run's summary.json (decode tok/s, TTFT).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one(blas: str | None, folder: Path) -> dict:
    env = dict(os.environ)
    env.pop("SPECPIPE_BLAS", None)
    if blas:
        env["SPECPIPE_BLAS"] = blas
    before = set(folder.glob("outputs/*/*"))
    proc = subprocess.run(
        [sys.executable, "-m", "specpipe.cli", "stream=false"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        sys.exit(f"specpipe failed: {proc.stderr.strip().splitlines()[-1]}")
    (run,) = set(folder.glob("outputs/*/*")) - before
    summary = json.loads((run / "summary.json").read_text())
    return {"blas": summary["device"].get("blas"), **{k: summary["stats"][k] for k in ("decode_tok_s", "ttft_s")}}


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    sides = sys.argv[2:] or ["none", "default"]
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for side in sides:  # untimed: fills any calibration cache and the page cache
            one(None if side == "default" else side, folder)
        for r in range(repeats):
            for side in sides if r % 2 == 0 else sides[::-1]:
                runs[side].append(one(None if side == "default" else side, folder))
    med = {n: {k: statistics.median(x[k] for x in rs) for k in ("decode_tok_s", "ttft_s")} for n, rs in runs.items()}
    for n, rs in runs.items():
        print(
            f"{n[-20:]:20} BLAS {rs[0]['blas']:9} decode {med[n]['decode_tok_s']:6.1f} tok/s  "
            f"TTFT {med[n]['ttft_s']:.2f} s  "
            "(runs: " + ", ".join(f"{x['decode_tok_s']:.1f}" for x in rs) + ")"
        )
    first = sides[0]
    for n in sides[1:]:
        print(
            f"{n} / {first}: decode {med[n]['decode_tok_s'] / med[first]['decode_tok_s']:.2f}x, "
            f"TTFT {med[n]['ttft_s'] / med[first]['ttft_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
