"""TUI tests: token styling from events (pure), the replay source, CLI flags,
and Pilot runs of the app on scripted events and on a tiny random model."""

from __future__ import annotations

import asyncio
import time

import pytest
from hydra import compose, initialize

import specpipe.config  # noqa: F401
from specpipe.events import Drafted, Emitted, RunFinished, RunStarted, Verified, read_events
from specpipe.pipeline import RunControl
from tui.app import ChatApp
from tui.cli import parse_replay
from tui.figures import Figures
from tui.sources import LiveSource, ReplaySource
from tui.transcript import AnswerTranscript, Piece, printable, step_pieces
from tui.widgets.answer import Answer
from tui_script import EXPECTED_TEXT, scripted_decode, scripted_events

SIZE = (100, 30)


def tiny_cfg(*overrides: str):
    with initialize(version_base=None, config_path="../specpipe/conf"):
        return compose("config", overrides=["model=tiny-random", "draft=ngram", "max_tokens=40", *overrides])


async def wait_for(pilot, condition, timeout: float = 30.0) -> None:
    """Let the app run until `condition()` holds (workers post from threads)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await pilot.pause(0.05)


def answers(app: ChatApp) -> list[Answer]:
    return list(app.query(Answer))


# ---- events -> styled pieces (no Textual)


def test_step_pieces_order_accepted_rejected_recovered():
    emitted = Emitted(step=2, token_ids=[7, 8, 9], text="abX", from_draft=2, token_texts=["a", "b", "X"])
    verified = Verified(step=2, accepted_ids=[7, 8], rejected_ids=[5, 6], recovered_id=9, seconds=0, rejected_text="cd")
    assert step_pieces(emitted, verified) == [Piece("ab", "accepted", 2), Piece("cd", "rejected", 2), Piece("X", "recovered", 2)]


def test_step_pieces_bonus_and_plain_decoding():
    full = Verified(step=1, accepted_ids=[1, 2], rejected_ids=[], bonus_id=3, seconds=0)
    emitted = Emitted(step=1, token_ids=[1, 2, 3], text="xyz", from_draft=2, token_texts=["x", "y", "z"])
    assert [p.kind for p in step_pieces(emitted, full)] == ["accepted", "bonus"]
    plain = Verified(step=1, accepted_ids=[], rejected_ids=[], bonus_id=3, seconds=0)
    assert step_pieces(Emitted(step=1, token_ids=[3], text="z", from_draft=0, token_texts=["z"]), plain) == [Piece("z", "target", 1)]


def test_old_recordings_without_token_texts_fall_back_to_decode():
    with_texts, without = scripted_events(), scripted_events(with_texts=False)
    exact, decoded, bare = AnswerTranscript(), AnswerTranscript(scripted_decode), AnswerTranscript()
    for a, b in zip(with_texts, without):
        exact.consume(a)
        decoded.consume(b)
        bare.consume(b)
    assert decoded.pieces == exact.pieces  # a tokenizer recovers the exact split
    assert bare.text == exact.text == EXPECTED_TEXT  # no tokenizer: coarser spans, same text
    assert "\u27e82 rejected\u27e9" in [p.text for p in bare.pieces]


def test_control_bytes_are_made_visible():
    assert printable("a\x1b[2J\x08b\nc\t") == "a\u241b[2J\u2408b\nc\t"


def test_figures_come_from_event_times():
    figures = Figures()
    for event in scripted_events():
        figures.consume(event)
    rows = dict(figures.rows())
    assert rows["acceptance"] == "83% (10/12)" and rows["tok/forward"] == "3.50"
    assert rows["TTFT"] == "0.20 s" and rows["K"] == "4" and rows["stop"] == "eos" and rows["peak mem"] == "300 MiB"
    assert figures.step_rates == [1.0, 0.5, 1.0]  # the plain step drafted nothing


# ---- replay source and CLI flags


def test_replay_paces_and_stops():
    events = scripted_events()
    start = time.monotonic()
    assert list(ReplaySource(events, speed=2).generate([], RunControl())) == events
    assert time.monotonic() - start >= events[-1].t / 2 - 0.01
    control = RunControl()
    played = []
    for event in ReplaySource(events, speed=0.5).generate([], control):
        played.append(event)
        control.stop_requested = isinstance(event, Emitted)
    assert isinstance(played[-1], RunFinished) and played[-1].stop_reason == "stopped"
    assert played[-1].text == played[-2].text  # exactly what was shown before the stop


def test_replay_refuses_files_without_runs():
    with pytest.raises(ValueError, match="RunStarted"):
        ReplaySource(scripted_events()[1:])


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--replay", "e.jsonl", "--speed=0", "budget.k=4"], ("e.jsonl", 0.0, ["budget.k=4"])),
        (["--replay=e.jsonl"], ("e.jsonl", 1.0, [])),
        (["draft=none", "budget.k=2"], (None, 1.0, ["draft=none", "budget.k=2"])),
    ],
)
def test_parse_replay(argv, expected):
    assert parse_replay(argv) == expected


@pytest.mark.parametrize("argv, words", [(["--replay"], "needs a value"), (["--replay", "x", "--speed", "fast"], "give a number"),
                                         (["--speed", "2"], "only applies")])
def test_parse_replay_errors(argv, words):
    with pytest.raises(ValueError, match=words):
        parse_replay(argv)


# ---- Pilot: scripted events (no model)


async def test_scripted_replay_shows_highlighted_transcript():
    app = ChatApp(ReplaySource(scripted_events(), speed=0))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.control is None and answers(app))
        (answer,) = answers(app)
        assert answer.text == EXPECTED_TEXT
        kinds = {p.kind for p in answer.transcript.pieces}
        assert kinds == {"accepted", "rejected", "recovered", "bonus", "target"}
        assert str(answer.render()).count("return") == 2  # the rejected span is on screen
        await pilot.press("ctrl+t")  # highlighting "kept": rejected drafts disappear
        assert answer.mode == "kept" and str(answer.render()).count("return") == 1
        await pilot.press("ctrl+t", "ctrl+t")
        assert answer.mode == "all"
        await pilot.press("enter")  # replays again as a second turn
        await wait_for(pilot, lambda: app.control is None and len(answers(app)) == 2)
        assert answers(app)[1].text == EXPECTED_TEXT


async def test_help_and_config_screens():
    app = ChatApp(ReplaySource(scripted_events(), speed=0))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.control is None and answers(app))
        await pilot.press("f1")
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.press("f2")
        assert type(app.screen).__name__ == "ConfigScreen" and "budget" in app.screen.config_yaml
        await pilot.press("escape")
        assert len(app.screen_stack) == 1


# ---- Pilot: a tiny random model through a live Session


async def test_live_chat_streams_stops_and_clears(tmp_path):
    source = LiveSource(tiny_cfg("max_tokens=100000"), record_to=tmp_path / "events.jsonl")
    app = ChatApp(source)
    batches = []
    async with app.run_test(size=SIZE, message_hook=lambda m: batches.append(m) if type(m).__name__ == "EventsArrived" else None) as pilot:
        await pilot.click("#prompt")
        await pilot.press(*"hello", "enter")
        assert app.messages[0] == {"role": "user", "content": "hello"}
        await wait_for(pilot, lambda: len(answers(app)[0].text) > 0)  # tokens are streaming
        await pilot.press("escape")  # stop mid-generation
        await wait_for(pilot, lambda: app.control is None)
        answer = answers(app)[0]
        assert app.figures.stop_reason == "stopped" and answer.note == "[stopped]"
        assert app.messages[-1] == {"role": "assistant", "content": answer.text}  # the partial answer is kept
        assert dict(app.figures.rows())["tokens"] != "0 in 0 steps"
        assert len(batches) < sum(len(b.events) for b in batches)  # events were coalesced

        await pilot.press("ctrl+n")
        assert app.messages == [] and answers(app) == [] and app.figures.step_rates == []
    source.close()
    recorded = read_events(tmp_path / "events.jsonl")
    assert isinstance(recorded[0], RunStarted) and recorded[-1].stop_reason == "stopped"


async def test_live_multi_turn_k_change_and_replay_of_the_recording(tmp_path):
    source = LiveSource(tiny_cfg("budget.k=3"), record_to=tmp_path / "events.jsonl")
    app = ChatApp(source)
    async with app.run_test(size=SIZE) as pilot:
        for turn, text in enumerate(["first", "second"], start=1):
            await pilot.click("#prompt")
            await pilot.press(*text, "enter")
            await wait_for(pilot, lambda: app.control is None and len(app.messages) == 2 * turn)
            if turn == 1:
                await pilot.press("ctrl+up", "ctrl+up")  # K 3 -> 5 for the next answer
        live = [a.text for a in answers(app)]
        live_pieces = [a.transcript.pieces for a in answers(app)]
        assert app.next_k == 5
    source.close()
    recorded = read_events(tmp_path / "events.jsonl")
    first_k = [e.k for e in recorded if isinstance(e, Drafted) and e.step == 1]
    assert first_k == [3, 5]  # the K change applied to the next answer
    assert [e.prompt_text for e in recorded if isinstance(e, RunStarted)] == ["first", "second"]
    assert [e.text for e in recorded if isinstance(e, RunFinished)] == live

    replay = ChatApp(ReplaySource(recorded, speed=0))
    async with replay.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: replay.control is None and len(answers(replay)) == 2)
        assert [a.text for a in answers(replay)] == live
        assert [a.transcript.pieces for a in answers(replay)] == live_pieces  # same highlighting too


async def test_a_model_that_fails_to_load_is_shown_not_raised(tmp_path):
    app = ChatApp(LiveSource(tiny_cfg(f"model.path={tmp_path}/missing.gguf", "model.name=null")))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#prompt")
        await pilot.press(*"hi", "enter")
        await wait_for(pilot, lambda: app.control is None)
        assert answers(app)[0].note.startswith("error: ")
        assert app.messages == [] and not app.query_one("#prompt").disabled
