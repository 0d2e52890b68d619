"""Short runs of scripts/prefix_serve.py against real servers on a tiny random model (the sittings themselves, on
SmolLM2 with their figures in docs/benchmarks.md, are by hand): clients sharing a system prompt take it from the
store and answer as the store-off server does; many varied prefixes under a small `prefix_cache.bytes` evict and
keep the store within its bound."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "prefix_serve.py"


def _script():
    spec = importlib.util.spec_from_file_location("prefix_serve", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.statistical  # starts three servers: `python -m pytest -q -m statistical`
def test_shared_system_prompt_and_a_small_store(tmp_path, monkeypatch):
    script = _script()
    monkeypatch.chdir(tmp_path)  # the servers' run folders
    overrides = ["model=tiny-random", "draft=ngram"]
    shared = script.shared(overrides, clients=3, repeats=1, max_tokens=2, timeout=120, log=lambda line: None)
    on, off = (next(b for b in shared["bursts"] if b["store"] == s) for s in ("on", "off"))
    assert shared["answers_equal"] and off["reused_tokens"] == 0
    assert on["reused_tokens"] == on["metrics_reused"] and on["prefilled_tokens"] < off["prefilled_tokens"] / 2, on
    warm = next(b for b in shared["bursts"] if b["store"] == "on" and b["burst"] == "warm")
    assert warm["prefilled_tokens"] < on["prefilled_tokens"], warm  # the system prompt was stored: tails only
    memory = script.memory(overrides, 8, 2_000_000, 2, 2, 120, log=lambda line: None)
    assert memory["evictions"] > 0 and memory["store_bytes_max"] <= 2_000_000, memory
