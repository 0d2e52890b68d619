"""TUI tests: token styling from events (pure), the replay source, CLI flags,
and Pilot runs of the app on scripted events, on a recorded SmolLM2 run and
on a tiny random model."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import pytest
from hydra import compose, initialize
from rich.console import Console
from tui_script import EXPECTED_TEXT, scripted_decode, scripted_events

import specpipe.config.schema  # noqa: F401
from specpipe.core.pipeline import RunControl
from specpipe.events import Drafted, Emitted, RunFinished, RunStarted, Verified, read_events
from tui.app import ChatApp
from tui.cli import parse_flags, parse_replay, recorded_config
from tui.figures import Figures
from tui.sources import LiveSource, ReplaySource, chat_history
from tui.transcript import SPECIAL, AnswerTranscript, Piece, printable, special_pattern, split_special, step_pieces
from tui.widgets.answer import Answer
from tui.widgets.step_strip import step_cell

SIZE = (100, 30)
# A real low-acceptance run: SmolLM2-135M, prose, n-gram drafts (3% accepted; rejected drafts hold
# `<|im_end|>\n<|im_start|>assistant`). Recorded with: specpipe prompt=story max_tokens=96 draft=ngram
# budget.k=8 "prompt.system='Always answer in French.'" stream=false
STORY = Path(__file__).parent / "data" / "smollm2_story_ngram.jsonl"


def tiny_cfg(*overrides: str):
    with initialize(version_base=None, config_path="../specpipe/conf"):
        return compose("config", overrides=["model=tiny-random", "draft=ngram", "max_tokens=40", *overrides])


async def wait_for(pilot, condition, timeout: float = 30.0) -> None:
    """Let the app run until `condition()` holds (workers post from threads)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await pilot.pause(0.05)


async def wait_for_exit(app: ChatApp, timeout: float = 30.0) -> None:
    """Until the app has exited (the pilot can no longer pause on its screens)."""
    deadline = time.monotonic() + timeout
    while app.is_running:
        assert time.monotonic() < deadline, "the app did not exit"
        await asyncio.sleep(0.05)


def answers(app: ChatApp) -> list[Answer]:
    return list(app.query(Answer))


def screen_text(app: ChatApp) -> str:
    """The screen as plain text, as a person reads it (what export_screenshot draws, without styles)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


# ---- events -> styled pieces (no Textual)


def test_step_pieces_order_accepted_rejected_recovered():
    emitted = Emitted(step=2, token_ids=[7, 8, 9], text="abX", from_draft=2, token_texts=["a", "b", "X"])
    verified = Verified(step=2, accepted_ids=[7, 8], rejected_ids=[5, 6], recovered_id=9, seconds=0, rejected_text="cd")
    assert step_pieces(emitted, verified) == [
        Piece("ab", "accepted", 2),
        Piece("cd", "rejected", 2),
        Piece("X", "recovered", 2),
    ]


def test_step_pieces_bonus_and_plain_decoding():
    full = Verified(step=1, accepted_ids=[1, 2], rejected_ids=[], bonus_id=3, seconds=0)
    emitted = Emitted(step=1, token_ids=[1, 2, 3], text="xyz", from_draft=2, token_texts=["x", "y", "z"])
    assert [p.kind for p in step_pieces(emitted, full)] == ["accepted", "bonus"]
    plain = Verified(step=1, accepted_ids=[], rejected_ids=[], bonus_id=3, seconds=0)
    assert step_pieces(Emitted(step=1, token_ids=[3], text="z", from_draft=0, token_texts=["z"]), plain) == [
        Piece("z", "target", 1)
    ]


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


def test_special_tokens_are_found_in_text():
    assert split_special("hi<|im_end|>\n<|im_start|>assistant") == [
        ("hi", False),
        ("<|im_end|>", True),
        ("\n", False),
        ("<|im_start|>", True),
        ("assistant", False),
    ]
    assert split_special("a <b> c | d", SPECIAL) == [("a <b> c | d", False)]  # ordinary text is left alone
    custom = special_pattern(["</s>", "<pad>"])
    assert [t for t, special in split_special("x</s>y<pad><|eot_id|>", custom) if special] == [
        "</s>",
        "<pad>",
        "<|eot_id|>",
    ]


def test_transcript_answer_drops_rejected_drafts_and_special_tokens():
    transcript = AnswerTranscript()
    for event in read_events(STORY):
        transcript.consume(event)
    finished = read_events(STORY)[-1]
    assert transcript.text == finished.text  # the pipeline's own answer
    assert any("<|im_end|>" in p.text for p in transcript.pieces if p.kind == "rejected")
    assert "<|im" not in transcript.answer() and transcript.answer() == finished.text.replace("<|im_end|>", "")
    assert len(transcript.steps) == sum(1 for e in read_events(STORY) if isinstance(e, Verified))


@pytest.mark.parametrize(
    "drafted, accepted, expected",
    [
        (4, 4, ("\u2588", "all")),
        (4, 0, ("\u2581", "none")),
        (4, 2, ("\u2585", "some")),
        (8, 1, ("\u2582", "some")),
        (0, 0, ("\u00b7", "plain")),
    ],
)
def test_step_cells(drafted, accepted, expected):
    assert step_cell(drafted, accepted) == expected


def test_control_bytes_are_made_visible():
    assert printable("a\x1b[2J\x08b\nc\t") == "a\u241b[2J\u2408b\nc\t"


def test_figures_come_from_event_times():
    figures = Figures()
    for event in scripted_events():
        figures.consume(event)
    rows = dict(figures.rows())
    assert rows["acceptance"] == "83% (10/12)" and rows["tok/forward"] == "3.50"
    assert rows["TTFT"] == "0.20 s" and rows["K"] == "4 of fixed(k=4)" and rows["stop"] == "eos"
    assert rows["peak mem"] == "300 MiB MLX"  # labelled: MLX's counter, not the resident size the CLI prints
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


def test_parse_web_and_resume_flags():
    flags = parse_flags(["--web", "--port", "8123", "--resume=chat.jsonl", "budget.k=4"])
    assert (flags.web, flags.port, flags.resume, flags.rest) == (True, 8123, "chat.jsonl", ["budget.k=4"])


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--replay"], "needs a value"),
        (["--replay", "x", "--speed", "fast"], "give a number"),
        (["--speed", "2"], "only applies"),
        (["--port", "80"], "only applies to --web"),
        (["--web", "--port", "http"], "TCP port"),
        (["--replay", "a", "--resume", "b"], "not both"),
    ],
)
def test_parse_flag_errors(argv, words):
    with pytest.raises(ValueError, match=words):
        parse_flags(argv)


def test_resume_takes_the_recorded_config_and_value_overrides():
    events = read_events(STORY)
    cfg = recorded_config(events, ["budget.k=3", "max_tokens=20"])
    assert (cfg.model.name, cfg.draft.name, cfg.budget.k, cfg.max_tokens) == ("smollm2-135m", "ngram", 3, 20)
    assert cfg.prompt.system == "Always answer in French."
    with pytest.raises(ValueError, match="keeps its groups"):
        recorded_config(events, ["draft=none"])
    assert chat_history(events) == [
        {"role": "user", "content": events[0].prompt_text},
        {"role": "assistant", "content": events[-1].text},
    ]


# ---- Pilot: scripted events (no model)


async def test_scripted_replay_shows_highlighted_transcript():
    app = ChatApp(ReplaySource(scripted_events(), speed=0))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.control is None and answers(app))
        (answer,) = answers(app)
        assert answer.text == EXPECTED_TEXT
        kinds = {p.kind for p in answer.transcript.pieces}
        assert kinds == {"accepted", "rejected", "recovered", "bonus", "target"}
        assert str(answer.render()) == EXPECTED_TEXT  # clean view: the answer alone
        await pilot.press("ctrl+t")  # full view: the rejected span is shown where it was proposed
        assert answer.mode == "full" and str(answer.render()).count("return") == 2
        await pilot.press("ctrl+t", "ctrl+t")
        assert answer.mode == "clean"
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


async def test_low_acceptance_answer_reads_as_plain_text():
    """A real 3%-acceptance prose run: the default view is the answer alone, copying yields it,
    special tokens never appear as text, and the full view is one key away."""
    events = read_events(STORY)
    answer_text = events[-1].text.replace("<|im_end|>", "")
    app = ChatApp(ReplaySource(events, speed=0))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.control is None and answers(app))
        (answer,) = answers(app)
        await pilot.pause(0.1)
        assert str(answer.render()) == answer_text  # no rejected draft inside the answer
        screen = screen_text(app)
        assert "<|" not in screen and "\u27e8" not in screen
        await pilot.press("ctrl+y")
        assert app.clipboard == answer_text
        await pilot.press("ctrl+t")
        full = str(answer.render())
        assert len(full) > len(answer_text) and "\u27e8im_end\u27e9" in full and "<|im" not in full
        assert "<|" not in screen_text(app)


async def test_every_stat_shows_at_80x24_and_help_fits():
    app = ChatApp(ReplaySource(scripted_events(), speed=0))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.control is None and answers(app))
        await pilot.pause(0.1)
        assert app.screen.has_class("-narrow")
        await wait_for(pilot, lambda: "Quit" in screen_text(app))  # the footer is composed after the bindings settle
        screen = screen_text(app)
        for label, value in app.figures.rows():
            assert label in screen and value in screen, (label, value)
        assert EXPECTED_TEXT.splitlines()[1] in screen  # the answer still has room
        for key in ("^q Quit", "^t View", "^\u2191 K+", "f1 Help"):
            assert key in screen.rstrip().splitlines()[-1]
        await pilot.press("f1")
        help_box = app.screen.query_one("#help-box")
        assert help_box.region.width <= 80 and help_box.region.height <= 24
        assert help_box.max_scroll_y == 0  # nothing hidden below the box
        await pilot.press("x")  # any key closes it
        assert len(app.screen_stack) == 1


async def test_keys_match_the_footer_when_idle():
    app = ChatApp(ReplaySource(scripted_events(), speed=0))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.control is None and answers(app))
        shown = {b.binding.key for b in app.active_bindings.values() if b.binding.show and b.enabled}
        assert "plus" not in shown and "minus" not in shown and "escape" not in shown and "ctrl+q" in shown
        await pilot.press("+", "-", "1")
        assert app.query_one("#prompt").value == "+-1"  # idle: + and - are text
        await pilot.press("ctrl+c")  # clears the line, as a shell does
        assert app.query_one("#prompt").value == "" and app.is_running
        await pilot.press("ctrl+c")  # an empty line: arms quitting
        assert app.is_running
        await pilot.press("ctrl+c")
        await wait_for_exit(app)


# ---- Pilot: a tiny random model through a live Session


async def test_live_chat_streams_stops_and_clears(tmp_path):
    source = LiveSource(
        tiny_cfg("max_tokens=100000", "+model.tiny.max_position_embeddings=1000000"),
        record_to=tmp_path / "events.jsonl",
    )
    app = ChatApp(source)
    batches = []
    async with app.run_test(
        size=SIZE, message_hook=lambda m: batches.append(m) if type(m).__name__ == "EventsArrived" else None
    ) as pilot:
        await pilot.click("#prompt")
        await pilot.press(*"hello", "enter")
        assert app.messages[0] == {"role": "user", "content": "hello"}
        await wait_for(pilot, lambda: len(answers(app)[0].text) > 0)  # tokens are streaming
        shown = {b.binding.key for b in app.active_bindings.values() if b.binding.show and b.enabled}
        assert "escape" in shown  # the footer offers Stop while answering
        k = app.next_k
        await pilot.press("+")  # the input is disabled: + is K+, not text
        assert app.next_k == k + 1 and app.control.k == k + 1 and app.query_one("#prompt").value == ""
        await pilot.press("escape")  # stop mid-generation
        await wait_for(pilot, lambda: app.control is None)
        answer = answers(app)[0]
        assert app.figures.stop_reason == "stopped" and answer.note.startswith("[stopped]")
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


async def test_prompt_system_reaches_the_prompt_ids(tmp_path):
    source = LiveSource(
        tiny_cfg("prompt.system='Always answer in French.'", "max_tokens=4"), record_to=tmp_path / "events.jsonl"
    )
    app = ChatApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#prompt")
        await pilot.press(*"hi", "enter")
        await wait_for(pilot, lambda: app.control is None and len(app.messages) == 2)
    source.close()
    started = [e for e in read_events(tmp_path / "events.jsonl") if isinstance(e, RunStarted)]
    decoded = source.session.target.decode(started[0].prompt_ids)
    assert "Always answer in French." in decoded and decoded.index("Always answer") < decoded.index("hi")
    assert started[0].prompt_text == "hi"  # the turn is the user's text; the system prompt only goes to the model


async def test_save_then_resume_continues_the_chat(tmp_path):
    cfg = tiny_cfg("max_tokens=12")
    app = ChatApp(LiveSource(cfg), save_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#prompt")
        await pilot.press(*"first", "enter")
        await wait_for(pilot, lambda: app.control is None and len(app.messages) == 2)
        first_answer = app.messages[1]["content"]
        await pilot.press("ctrl+s")
    app.source.close()
    (saved,) = tmp_path.glob("chat-*.jsonl")
    events = read_events(saved)

    source = LiveSource(recorded_config(events, []), record_to=tmp_path / "resumed.jsonl")
    resumed = ChatApp(source, history=events)
    async with resumed.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        assert resumed.messages == [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": first_answer},
        ]
        assert answers(resumed)[0].text == first_answer  # the earlier turn is drawn
        await pilot.click("#prompt")
        await pilot.press(*"second", "enter")
        await wait_for(pilot, lambda: resumed.control is None and len(resumed.messages) == 4)
    source.close()
    started = [e for e in read_events(tmp_path / "resumed.jsonl") if isinstance(e, RunStarted)]
    decoded = source.session.target.decode(started[-1].prompt_ids)
    assert "first" in decoded and first_answer.strip()[:8] in decoded and decoded.rstrip().count("second") == 1


async def test_config_groups_reach_the_run_as_in_the_cli(tmp_path):
    """Sampling, budget and drafter overrides compose into the chat's Session as into `specpipe`'s."""
    source = LiveSource(
        tiny_cfg("budget=adaptive", "sampling=sample", "sampling.seed=7", "compare=match", "max_tokens=6"),
        record_to=tmp_path / "events.jsonl",
    )
    app = ChatApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        assert "temperature" in app.screen.config_yaml and "adaptive" in app.screen.config_yaml  # before any answer
        await pilot.press("escape")
        await pilot.click("#prompt")
        await pilot.press(*"hi", "enter")
        await wait_for(pilot, lambda: app.control is None and len(app.messages) == 2)
    source.close()
    started = next(e for e in read_events(tmp_path / "events.jsonl") if isinstance(e, RunStarted))
    assert started.budget.startswith("adaptive(") and started.seed == 7 and started.compare == "match"


@pytest.mark.parametrize(
    "args, words",
    [(["--resume", "STORY", "draft=none"], "keeps its groups"), (["--resume", "missing.jsonl"], "cannot read")],
)
def test_resume_errors_are_one_line(args, words):
    import subprocess
    import sys

    args = [str(STORY) if a == "STORY" else a for a in args]
    result = subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and words in result.stderr, result.stderr


async def test_quit_mid_answer_keeps_the_recording_whole(tmp_path):
    source = LiveSource(
        tiny_cfg("max_tokens=100000", "+model.tiny.max_position_embeddings=1000000"),
        record_to=tmp_path / "events.jsonl",
    )
    app = ChatApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#prompt")
        await pilot.press(*"go", "enter")
        await wait_for(pilot, lambda: answers(app) and len(answers(app)[0].text) > 0)
        await pilot.press("ctrl+q")
        await wait_for_exit(app)
    source.close()
    recorded = read_events(tmp_path / "events.jsonl")
    assert isinstance(recorded[-1], RunFinished) and recorded[-1].stop_reason == "stopped"


async def test_browser_footer_offers_keys_a_browser_lets_through(monkeypatch):
    """Browsers keep Ctrl+N / Ctrl+T; under --web F4 / F3 do those jobs and the footer says so."""
    monkeypatch.setattr(ChatApp, "is_web", property(lambda self: True))
    app = ChatApp(ReplaySource(scripted_events(), speed=0))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.control is None and answers(app))
        shown = {b.binding.key for b in app.active_bindings.values() if b.binding.show and b.enabled}
        assert {"f3", "f4"} <= shown and not {"ctrl+t", "ctrl+n"} & shown
        await pilot.press("f3")
        assert app.mode == "full"


async def test_sigterm_mid_answer_exits_143_and_keeps_the_recording(tmp_path):
    import os
    import signal

    source = LiveSource(
        tiny_cfg("max_tokens=100000", "+model.tiny.max_position_embeddings=1000000"),
        record_to=tmp_path / "events.jsonl",
    )
    app = ChatApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.click("#prompt")
        await pilot.press(*"go", "enter")
        await wait_for(pilot, lambda: answers(app) and len(answers(app)[0].text) > 0)
        os.kill(os.getpid(), signal.SIGTERM)  # the app's loop handles it (no default kill)
        await wait_for_exit(app)
    source.close()
    assert app.return_code == 143
    recorded = read_events(tmp_path / "events.jsonl")
    assert isinstance(recorded[-1], RunFinished) and recorded[-1].stop_reason == "stopped"


async def test_a_prompt_named_on_the_command_line_is_sent_first():
    app = ChatApp(LiveSource(tiny_cfg("max_tokens=4")), first_message="hello there")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.control is None and len(app.messages) == 2)
        assert app.messages[0] == {"role": "user", "content": "hello there"} and answers(app)[0].text


async def test_a_setting_predicted_slower_than_plain_is_a_notice_once_and_stays_in_the_panel_and_f2():
    """RunStarted.warnings (specpipe/advice.py), which the CLI prints as `specpipe: warning: ...`: the local chat
    shows each as a warning notice when the first answer starts (not again on later turns), keeps a panel row,
    and heads the F2 config screen with them; a setting without warnings shows none of it."""

    def notices(messages):
        return [m.notification for m in messages if type(m).__name__ == "Notify"]

    seen: list = []
    # tiny-random has 2 layers: a 1-layer draft costs ~0.5 of a step per token, K = 8 is ~0.4x at 50% acceptance
    app = ChatApp(LiveSource(tiny_cfg("draft=layerskip", "draft.depth=1", "max_tokens=4")))
    async with app.run_test(size=SIZE, message_hook=seen.append) as pilot:
        for turn, text in enumerate(["first", "second"], start=1):
            await pilot.click("#prompt")
            await pilot.press(*text, "enter")
            await wait_for(pilot, lambda: app.control is None and len(app.messages) == 2 * turn)
        (notice,) = [n for n in notices(seen) if n.severity == "warning"]
        assert notice.title == "predicted slower than plain" and notice.message.startswith("draft=layerskip costs")
        assert notice.message == app.figures.warnings[0] and "pays only if the target accepts over" in notice.message
        assert dict(app.figures.rows())["warning"] == "slower (see F2)"
        assert "slower (see F2)" in screen_text(app)
        await pilot.press("f2")
        assert app.screen.config_yaml.startswith(f"# warning: {notice.message}\n")
        assert "layerskip" in app.screen.config_yaml.split("\n", 1)[1]  # the config follows

    seen.clear()
    plain = ChatApp(LiveSource(tiny_cfg("max_tokens=4")), first_message="hello")
    async with plain.run_test(size=SIZE, message_hook=seen.append) as pilot:
        await wait_for(pilot, lambda: plain.control is None and len(plain.messages) == 2)
        assert not [n for n in notices(seen) if n.severity == "warning"] and "warning" not in dict(plain.figures.rows())
