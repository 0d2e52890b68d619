"""ChatApp: multi-turn chat over an event source, with speculation made visible.

Takes a source (tui/sources.py: live Session or recorded events) in its
constructor. A thread worker iterates the source and posts batches of events;
the UI thread turns them into styled answers and live figures. Stopping and
K changes go through the pipeline's RunControl, never into its internals.
"""

from __future__ import annotations

import time

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header, Input, Static
from textual.worker import get_current_worker

from specpipe.events import Emitted, RunError, RunFinished, RunStarted
from specpipe.pipeline import RunControl
from tui.figures import Figures
from tui.messages import EventsArrived, GenerationEnded, GenerationFailed
from tui.screens.config import ConfigScreen
from tui.screens.help import HelpScreen
from tui.widgets.answer import Answer
from tui.widgets.legend import Legend
from tui.widgets.stats_panel import StatsPanel
from tui.widgets.token_view import MODES

FLUSH_S = 1 / 30  # coalesce fast streams: at most ~30 UI updates a second
MAX_K = 64


class ChatApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "specpipe-chat"
    AUTO_FOCUS = "#prompt"
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+c", "stop", "Stop", show=False, priority=True),
        Binding("ctrl+n", "new_chat", "New chat", priority=True),
        Binding("ctrl+t", "toggle_highlight", "Highlight", priority=True),
        Binding("plus", "change_k(1)", "K+", key_display="+"),
        Binding("minus", "change_k(-1)", "K-", key_display="-"),
        Binding("ctrl+up", "change_k(1)", show=False, priority=True),
        Binding("ctrl+down", "change_k(-1)", show=False, priority=True),
        Binding("f2", "show_config", "Config"),
        Binding("f1,question_mark", "help", "Help"),
    ]

    def __init__(self, source, title: str | None = None):
        super().__init__()
        self.source = source
        self.sub_title = title or ("replay" if source.replay else "")
        self.messages: list[dict] = []  # chat history in the chat-template format
        self.figures = Figures()
        self.control: RunControl | None = None  # the running answer's knobs; None when idle
        self.next_k: int | None = source.k
        self.mode = MODES[0]  # highlighting: all -> kept (no rejected) -> off
        self.answer: Answer | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield VerticalScroll(id="log")
            with Vertical(id="side"):
                yield StatsPanel(id="stats")
                yield Legend(id="legend")
        placeholder = "Enter replays the recording" if self.source.replay else "Ask something; Enter sends"
        yield Input(placeholder=placeholder, id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(StatsPanel).show(self.figures, self.pending_k())
        if self.source.replay:
            self.start_answer(None)

    # ---- sending and streaming

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if self.control is not None or not (text or self.source.replay):
            return  # one answer at a time; empty lines are ignored
        event.input.clear()
        self.start_answer(text or None)

    def start_answer(self, text: str | None) -> None:
        """Show the user's turn (live) and start the worker; replay turns appear with their RunStarted."""
        if text is not None:
            self.messages.append({"role": "user", "content": text})
            self.add_turn(text)
            self.answer.note = "loading model..." if self.source.decode is None else ""
            self.answer.refresh_text()
        self.control = RunControl(k=None if self.source.replay else self.next_k)
        self.query_one(Input).disabled = True
        self.generate(list(self.messages), self.control)

    def add_turn(self, user_text: str) -> None:
        log = self.query_one("#log", VerticalScroll)
        self.answer = Answer(decode=self.source.decode, mode=self.mode, classes="answer")
        log.mount(Static(user_text, classes="user", markup=False), self.answer)
        log.scroll_end(animate=False)

    @work(thread=True, exclusive=True)
    def generate(self, messages: list[dict], control: RunControl) -> None:
        worker, batch, last_post = get_current_worker(), [], time.monotonic()
        try:
            for event in self.source.generate(messages, control):
                if worker.is_cancelled:
                    control.stop_requested = True  # keep draining: the pipeline still ends with RunFinished
                batch.append(event)
                final = isinstance(event, (RunStarted, RunFinished, RunError))
                if worker.is_cancelled:
                    batch = []  # a new chat was started: these events belong to the old one
                elif final or (isinstance(event, Emitted) and time.monotonic() - last_post >= FLUSH_S):
                    self.post_message(EventsArrived(batch))
                    batch, last_post = [], time.monotonic()
            if batch and not worker.is_cancelled:
                self.post_message(EventsArrived(batch))
        except Exception as exc:  # noqa: BLE001  (SpecpipeError, MemoryError, mlx errors: show, never crash)
            self.post_message(GenerationFailed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
        finally:
            self.post_message(GenerationEnded())

    def on_events_arrived(self, message: EventsArrived) -> None:
        for event in message.events:
            if isinstance(event, RunStarted) and self.source.replay:
                self.add_turn(event.prompt_text or "(recorded prompt)")  # live turns were added on Enter
            self.figures.consume(event)
            if self.answer is not None:
                self.answer.transcript.decode = self.source.decode  # the tokenizer exists once the model has loaded
                self.answer.consume(event)
                self.answer.note = self.finish_note(event) or ("" if isinstance(event, RunStarted) else self.answer.note)
            if isinstance(event, RunFinished) and not self.source.replay:
                self.messages.append({"role": "assistant", "content": event.text})
        self.redraw()

    @staticmethod
    def finish_note(event) -> str:
        if isinstance(event, RunFinished):
            return f"[{event.stop_reason}]" if event.stop_reason != "eos" else ""
        if isinstance(event, RunError):
            return f"error: {event.message}"
        return ""

    def on_generation_failed(self, message: GenerationFailed) -> None:
        if self.answer is not None:
            self.answer.note = f"error: {message.message}"
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()  # unanswered: let the user send it again
        self.notify(message.message, title="generation failed", severity="error", timeout=10)
        self.redraw()

    def on_generation_ended(self, message: GenerationEnded) -> None:
        self.control = None
        prompt = self.query_one(Input)
        prompt.disabled = False
        prompt.focus()

    def redraw(self) -> None:
        if self.answer is not None:
            self.answer.refresh_text()
            self.answer.refresh(layout=True)  # the answer grew: re-measure it, or its last lines can stay clipped
            self.query_one("#log", VerticalScroll).scroll_end(animate=False)
        self.query_one(StatsPanel).show(self.figures, self.pending_k())

    def pending_k(self) -> int | None:
        """K to show as coming next: before any step, or once the user changed it."""
        if self.source.replay or (self.figures.k is not None and self.next_k == self.source.k):
            return None
        return self.next_k

    # ---- actions

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "stop" and (self.control is None or len(self.screen_stack) > 1):
            return False  # idle or a dialog is open: Escape / Ctrl+C go to the focused widget
        return True

    def action_stop(self) -> None:
        if self.control is not None:
            self.control.stop_requested = True

    def action_new_chat(self) -> None:
        self.action_stop()
        self.workers.cancel_all()
        self.messages, self.figures, self.answer = [], Figures(), None
        self.query_one("#log", VerticalScroll).remove_children()
        self.redraw()
        if self.source.replay:
            self.notify("Enter replays the recording")

    def action_change_k(self, delta: int) -> None:
        if self.source.replay:
            self.notify("replay: K is as recorded")
            return
        base = self.next_k if self.next_k is not None else (self.figures.k or 0)
        self.next_k = max(0, min(MAX_K, base + delta))
        if self.control is not None:
            self.control.k = self.next_k  # takes effect from the next step of this answer
        self.redraw()

    def action_toggle_highlight(self) -> None:
        self.mode = MODES[(MODES.index(self.mode) + 1) % len(MODES)]
        for view in [*self.query(Answer), self.query_one(Legend)]:
            view.mode = self.mode
            view.refresh_text()

    def action_show_config(self) -> None:
        self.push_screen(ConfigScreen(self.figures.config_yaml or self.source.config_yaml))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())
