"""Checkpoint folders are data (issue 49): a schema-driven fuzzer (tests/checkpoint_fuzz.py) mutates every key of
every drafter layout's config.json and every field of its safetensors header; each mutant loads or is refused in
one line, never a traceback type of its own, a crash signal or an allocation past a bound. Rows in docs/faults.md
(the table test in test_faults.py reads this module too)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

from test_faults import ENV

HERE = Path(__file__).parent
BUDGET_S = 40  # the fuzzer stops here; the whole run takes about 10-20 s on 2 shared cores
MEMORY_CAP = 4 << 30  # an address-space cap for the fuzzer's process: an absurd size must be refused, not tried


def test_every_mutated_checkpoint_folder_loads_or_is_one_line(tmp_path):
    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP + (8 << 30), MEMORY_CAP + (8 << 30)))

    proc = subprocess.run(
        [sys.executable, str(HERE / "checkpoint_fuzz.py"), str(tmp_path), str(BUDGET_S)],
        cwd=HERE,
        env={**ENV, "PYTHONPATH": str(HERE)},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=cap_memory,
    )
    assert proc.returncode == 0, f"the fuzzer ended by {proc.returncode}\n{proc.stderr[-3000:]}"
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert not any(r["outcome"] == "out of time" for r in results), "the fuzzer ran out of time"
    layouts = {r["layout"] for r in results}
    assert layouts == {"eagle3-eagle", "eagle3-speculators", "dflash", "gemma4-assistant"}
    findings = [r for r in results if r["outcome"] not in ("loaded", "refused")]
    assert not findings, f"{len(findings)} of {len(results)} mutants were not one line: " + json.dumps(findings[:8])
    assert all("\n" not in r["message"] for r in results)
    refused = sum(r["outcome"] == "refused" for r in results)
    assert refused > len(results) // 3, f"only {refused} of {len(results)} mutants were refused"


def test_gemma4_token_ordering_outside_the_vocabulary_is_one_line(tmp_path):
    """The centroid head gathers and scatters by `masked_embedding.token_ordering` unchecked: an id outside the
    vocabulary read and wrote outside MLX's buffer. The reader now refuses it, naming the range."""
    import gemma4_tiny
    import pytest

    from specpipe.drafters.gemma4_assistant.layout import load_assistant
    from specpipe.errors import SpecpipeError

    cfg = gemma4_tiny.config(centroids=7)
    weights = gemma4_tiny.random_weights(cfg)
    order = weights["masked_embedding.token_ordering"]
    order[order.argmax()] = 10**9  # a 2**30-ish id where the vocabulary has 259
    folder = gemma4_tiny.write(tmp_path / "assistant", cfg, weights)
    with pytest.raises(SpecpipeError, match=r"token_ordering holds ids 0\.\.1000000000: allowed 0\.\.258"):
        load_assistant(str(folder))
