"""Bench noise guards on real runs (tiny random model, n-gram drafts): one plain run made 8x slower, as a burst of
load from another process makes it, gives a speed-up above the run's tokens per forward; the harness measures that
prompt again, keeps the clean figures and notes the re-measure; a prompt slow every time is flagged and left out of
the headline, whose excluded count the verdict and the report show."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

import specpipe.bench.measure as measure
import specpipe.config.schema  # noqa: F401  (registers the schemas)
from specpipe.bench.harness import run_bench
from specpipe.bench.noise import suspect
from specpipe.bench.report import geomean, verdicts, write_report

SLOW = 8.0


def bench(tmp_path, monkeypatch, slow_calls: set[int]):
    """Run a 2-prompt bench; the baseline measurements numbered in `slow_calls` (0-based) come back SLOW x slower."""
    real = measure.measure_specpipe
    calls: list[tuple[int, ...]] = []  # the prompt of each baseline measurement

    def measured(session, prompt_ids, max_tokens):
        run = real(session, prompt_ids, max_tokens)
        if session.drafter.name == "none":
            if len(calls) in slow_calls:
                run["decode_tok_s"] /= SLOW
                run["e2e_tok_s"] /= SLOW
            calls.append(tuple(prompt_ids))
        return run

    monkeypatch.setattr(measure, "measure_specpipe", measured)
    monkeypatch.setenv("SPECPIPE_CACHE", str(tmp_path / "cache"))
    results = tmp_path / "bench.jsonl"
    with initialize_config_module(config_module="specpipe.conf", version_base=None):
        cfg = compose(
            config_name="bench",
            overrides=[
                "model=tiny-random",
                "max_tokens=12",
                "warmup=false",
                "anchor=false",
                "limit=2",
                f"results={results}",
            ],
        )
    lines: list[str] = []
    records = run_bench(cfg, results, log=lines.append)
    return records, calls, lines, results


def test_one_slow_plain_run_is_measured_again(tmp_path, monkeypatch):
    records, calls, lines, _ = bench(tmp_path, monkeypatch, slow_calls={0})
    first, _ = records
    assert calls.count(calls[0]) == 2  # the first prompt's pair measured twice
    assert first["noise"]["first"].startswith("budget speed-up") and first["noise"]["flag"] is None
    assert suspect(first) is None and any("measuring it again" in line for line in lines)
    headline = verdicts(records)[0]
    kept = [r for r in records if not (r.get("noise") or {}).get("flag")]  # this machine's own noise may add one
    assert f"{geomean([r['speedup'] for r in kept]):.2f}x" in headline


def test_a_prompt_slow_every_time_is_flagged_and_left_out(tmp_path, monkeypatch):
    records, calls, _, results = bench(tmp_path, monkeypatch, slow_calls={0, 1})
    first, second = records
    assert calls[:2] == [calls[0], calls[0]] and first["noise"]["flag"]
    headline = verdicts(records)[0]
    if not (second.get("noise") or {}).get("flag"):  # unless this machine's own noise flagged it too
        assert "1 excluded as noise" in headline and f"{second['speedup']:.2f}x" in headline
    text = write_report(results).read_text()
    assert "excluded as noise" in text and "**noise, excluded**" in text


def test_a_plain_repeat_far_off_the_others_is_suspect():
    record = {"spec": {"tokens_per_forward": 2.0}, "speedup": 1.5, "baseline": {"decode_tok_s": 12.0}}
    assert suspect(record) is None
    record["baseline"]["decode_tok_s_runs"] = [2.8, 12.0, 12.4]
    assert "plain repeat at 2.8" in suspect(record)
    record["baseline"]["decode_tok_s_runs"] = [11.0, 12.0, 12.4]
    record["anchor"] = {"plain": {"decode_tok_s": 30.0}}
    assert "mlx-lm's plain 30.0" in suspect(record)


@pytest.mark.parametrize("speedup, flagged", [(2.1, False), (2.4, True)])
def test_a_speed_up_above_tokens_per_forward_is_suspect(speedup, flagged):
    record = {"spec": {"tokens_per_forward": 2.0}, "speedup": speedup, "baseline": {"decode_tok_s": 12.0}}
    assert (suspect(record) is not None) == flagged
