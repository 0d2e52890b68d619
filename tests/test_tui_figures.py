"""The chat's figures say what the CLI says (issue 51): whether speculation paid (the CLI summary's own
estimate, in the panel and under each answer), acceptance bars true to each step, K with its budget,
memory labelled, and no budget or acceptance for plain decoding. Scripted events and Pilot, no model."""

from __future__ import annotations

import msgspec
from test_tui import SIZE, answers, wait_for
from tui_script import scripted_events

from specpipe.costmodel.worth import StepLog, phrase, priced_estimate
from specpipe.events import Drafted, RunFinished, RunStarted, RunStats, Verified
from tui.app import ChatApp
from tui.figures import Figures, paid_note
from tui.sources import ReplaySource
from tui.widgets.stats_panel import rate_bars

RATIO = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4}  # T(n)/T(1): a verify of 5 costs 1.4 plain steps


def rejected_run(drafter: str = "ngram") -> list:
    """A story at 0% acceptance: 6 steps of 4 drafted tokens, none accepted (each step yields its one token)."""
    started = next(e for e in scripted_events() if isinstance(e, RunStarted))
    events: list = [msgspec.structs.replace(started, drafter=drafter, verify_ratio=RATIO, draft_cost=0.0)]
    for step in range(1, 7):
        k = 4 if drafter != "none" else 0
        ids = [7] * k
        events.append(Drafted(t=step, step=step, k=k, draft_ids=ids, seconds=0.001))
        events.append(Verified(t=step + 0.5, step=step, accepted_ids=[], rejected_ids=ids, recovered_id=3, seconds=0.1))
    stats = RunStats(
        generated_tokens=6, steps=6, drafted=24 if k else 0, peak_memory_bytes=528 << 20, peak_rss_bytes=815 << 20
    )
    events.append(RunFinished(t=10.0, stop_reason="eos", token_ids=[3] * 6, text="......", stats=stats))
    return events


def test_the_panel_estimate_is_the_cli_summarys():
    figures, steps = Figures(), StepLog()
    for event in rejected_run():
        figures.consume(event)
        steps.consume(event)
    expected = priced_estimate(steps, RATIO, 0.0)  # the summary line's figure and range, from the same costs
    assert 0 < expected.value < 1 and figures.estimate() == expected  # 6 tokens for 6 x 1.4 plain steps
    assert expected.low > 0 and expected.low <= expected.value <= expected.high  # 6 drafting steps: a range
    rows = dict(figures.rows())
    assert rows["vs plain"] == f"~{expected.value:.1f}x (est.)"  # the panel is narrow: the range is under the answer
    words = phrase(expected.value, expected.low, expected.high)
    assert paid_note(figures, "") == f"{words}: speculation did not pay"
    assert words.startswith(f"~{expected.value:.1f}x (") and words.endswith(") vs plain (estimated)")
    assert rows["K"] == "4 of fixed(k=4)"  # the budget's K for the step, and the budget it came from
    assert rows["peak mem"] == "815 MiB RSS, 528 MLX"  # the CLI's resident figure first, each labelled


def test_suffix_drafts_say_whether_they_came_from_history_or_the_context():
    """draft=suffix: the panel counts accepted / drafted tokens by where each draft came from (Drafted.source),
    and K names the latest step's."""
    started = next(e for e in scripted_events() if isinstance(e, RunStarted))
    events: list = [msgspec.structs.replace(started, drafter="suffix", verify_ratio=RATIO, draft_cost=0.0)]
    for step, (source, accepted) in enumerate([("history", 4), ("context", 1), ("history", 3)], 1):
        events.append(Drafted(t=step, step=step, k=4, draft_ids=[7] * 4, seconds=0.001, source=source))
        held, lost = [7] * accepted, [7] * (4 - accepted)
        recovered = None if not lost else 3
        events.append(
            Verified(
                t=step + 0.5,
                step=step,
                accepted_ids=held,
                rejected_ids=lost,
                recovered_id=recovered,
                bonus_id=None if lost else 5,
                seconds=0.1,
            )
        )
    figures = Figures()
    for event in events:
        figures.consume(event)
    rows = dict(figures.rows())
    assert rows["drafted from"] == "history 7/8, context 1/4", rows
    assert rows["K"].startswith("4 (history) of "), rows


def test_plain_decoding_shows_no_budget_acceptance_or_estimate():
    figures = Figures()
    for event in rejected_run(drafter="none"):
        figures.consume(event)
    rows = dict(figures.rows())
    assert not {"acceptance", "K", "budget", "vs plain"} & set(rows), rows
    assert paid_note(figures, "") == ""


def test_the_acceptance_bars_are_on_a_fixed_scale():
    assert rate_bars([0.125], 10) == "\u2582"  # a lone 12% step is low, not full height
    assert rate_bars([0.0, 0.5, 1.0], 10) == "\u2581\u2585\u2588"  # as the step strip's cells: round(rate x 7)
    assert rate_bars([1.0] * 5 + [0.0], 3) == "\u2588\u2588\u2581"  # the last steps that fit


async def test_a_replayed_answer_that_did_not_pay_says_so_under_it():
    app = ChatApp(ReplaySource(rejected_run(), speed=0))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.control is None and answers(app))
        (answer,) = answers(app)
        assert "vs plain (estimated): speculation did not pay" in answer.note
        spark = str(app.query_one("#acceptance-spark").render())
        assert spark == "\u2581" * 6  # six steps at 0%: six bottom bars
        shown = dict(app.figures.rows())  # what the panel draws
        assert shown["vs plain"].endswith("x (est.)") and shown["peak mem"].endswith("MLX")
