"""The README's first command (`specpipe` on the embedded SmolLM2) with MLX's reference BLAS and
with the BLAS specpipe loads by default, interleaved in one sitting; prints medians and ratios.

    python scripts/measure_quickstart.py [repeats]

Each run is a fresh `specpipe` process (as a user runs it), SPECPIPE_BLAS=none for the reference
side. Figures come from each run's summary.json (decode tok/s, TTFT).
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
    runs: dict[str, list[dict]] = {"reference": [], "default": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        one(None, folder)  # untimed: fills any calibration cache and the page cache
        for r in range(repeats):
            order = [("reference", "none"), ("default", None)]
            for name, blas in order if r % 2 == 0 else order[::-1]:
                runs[name].append(one(blas, folder))
    med = {n: {k: statistics.median(x[k] for x in rs) for k in ("decode_tok_s", "ttft_s")} for n, rs in runs.items()}
    for n, rs in runs.items():
        print(
            f"{n:9} BLAS {rs[0]['blas']:9} decode {med[n]['decode_tok_s']:6.1f} tok/s  TTFT {med[n]['ttft_s']:.2f} s  "
            "(runs: " + ", ".join(f"{x['decode_tok_s']:.1f}" for x in rs) + ")"
        )
    print(
        f"default / reference: decode {med['default']['decode_tok_s'] / med['reference']['decode_tok_s']:.2f}x, "
        f"TTFT {med['default']['ttft_s'] / med['reference']['ttft_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
