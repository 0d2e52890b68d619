"""ChatApp: multi-turn chat over an event source, with speculation made visible.

Takes a source (tui/sources.py: live Session or recorded events) in its
constructor, optionally the events of an earlier chat to continue
(`history`) and a first message to send. A thread worker iterates the source
and posts batches of events; the UI thread turns them into styled answers
and live figures. Stopping and K changes go through a RunControl
(specpipe/core/plan.py, a value the driver reads between steps), never into
the pipeline's internals; nothing here imports mlx (tests/test_layering.py). Below 100 columns the side panel moves
under the chat (the screen gets the `-narrow` class).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from datetime import datetime
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header, Static
from textual.worker import WorkerCancelled, WorkerFailed, get_current_worker

from specpipe.core.plan import K_MAX, RunControl
from specpipe.events import Emitted, EventWriter, PrefillDone, PrefillProgress, RunError, RunFinished, RunStarted
from tui.figures import Figures, paid_note
from tui.messages import EventsArrived, GenerationEnded, GenerationFailed
from tui.screens.config import ConfigScreen
from tui.screens.help import HelpScreen
from tui.widgets.answer import Answer
from tui.widgets.legend import Legend
from tui.widgets.prompt import PromptArea
from tui.widgets.stats_panel import StatsPanel
from tui.widgets.token_view import MODES

FLUSH_S = 1 / 30  # coalesce fast streams: at most ~30 UI updates a second
MAX_K = K_MAX  # the K keys stop at every K's one cap (core/plan.py)
QUIT_WAIT_S = 5.0  # Ctrl+Q waits this long at most for the running step to end
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
QUIT_AGAIN_S = 3.0  # a second Ctrl+C on an idle, empty prompt within this long quits
GENERATING_ONLY = {"stop", "change_k_typed"}
BROWSER_ONLY, BROWSER_REPLACED = {"web_new_chat", "web_cycle_view"}, {"new_chat", "cycle_view"}


class ChatApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "specpipe-chat"
    AUTO_FOCUS = "#prompt"
    ENABLE_COMMAND_PALETTE = False  # its footer entry would push the chat's own keys off an 80-column footer
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+c", "interrupt", "Stop/Quit", show=False, priority=True),
        Binding("ctrl+n", "new_chat", "New", priority=True),
        Binding("ctrl+t", "cycle_view", "View", priority=True),
        # browsers keep Ctrl+N / Ctrl+T for themselves: under --web these stand in (and show in the footer)
        Binding("f4", "web_new_chat", "New", priority=True),
        Binding("f3", "web_cycle_view", "View", priority=True),
        Binding("ctrl+up", "change_k(1)", "K+", key_display="^\u2191", priority=True),
        Binding("ctrl+down", "change_k(-1)", "K-", key_display="^\u2193", priority=True),
        # while an answer streams the input is disabled, so + and - can't be typed: they change K too
        Binding("plus", "change_k_typed(1)", show=False),
        Binding("minus", "change_k_typed(-1)", show=False),
        Binding("ctrl+s", "save", "Save", priority=True),
        Binding("ctrl+y", "copy_answer", "Copy", priority=True),
        Binding("f2", "show_config", "Config"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        source,
        title: str | None = None,
        history: list | None = None,
        first_message: str | None = None,
        save_dir: str | Path = "outputs/chat",
    ):
        """
        Args:
            source: a LiveSource or ReplaySource.
            title: the header's subtitle (model and drafter, or the replayed file).
            history: recorded events of an earlier chat, shown at once and continued (live sources).
            first_message: sent as soon as the app starts (`prompt.text` given on the command line).
            save_dir: where Ctrl+S writes the chat's events.
        """
        super().__init__()
        self.source = source
        self.sub_title = title or ("replay" if source.replay else "")
        self.history, self.first_message, self.save_dir = list(history or []), first_message, Path(save_dir)
        self.messages: list[dict] = []  # chat history in the chat-template format
        self.chat_events: list = []  # every event of this chat (since the last Ctrl+N), for Ctrl+S
        self.figures = Figures()
        self.control: RunControl | None = None  # the running answer's knobs; None when idle
        self.next_k: int | None = source.k
        self.mode = MODES[0]  # the view: clean -> full -> plain
        self.answer: Answer | None = None
        self.turn_shown = False  # the live turn is on screen before its RunStarted arrives
        self.quit_armed_at = 0.0
        self.generation = None  # the running answer's Worker
        self.warned: set[str] = set()  # warnings already shown as a notice (every answer's RunStarted repeats them)

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield VerticalScroll(id="log")
            with Vertical(id="side"):
                yield StatsPanel(id="stats")
                yield Legend(id="legend")
        placeholder = "Enter replays the recording" if self.source.replay else "Ask something; Enter sends"
        yield PromptArea(placeholder=placeholder, id="prompt")  # a TextArea: pasted code keeps its lines
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.handle_signals()
        self.query_one(StatsPanel).show(self.figures, self.pending_k())
        if self.history:
            self.on_events_arrived(EventsArrived(self.history))  # the earlier chat, drawn at once
            self.notify(f"resumed {len(self.messages) // 2} turn(s): the next message continues the chat")
        if self.source.replay:
            self.start_answer(None)
        elif self.first_message:
            self.start_answer(self.first_message)

    # ---- sending and streaming

    def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        text = event.value.strip()
        if self.control is not None or not (text or self.source.replay):
            return  # one answer at a time; empty lines are ignored
        event.area.clear()
        self.start_answer(text or None)

    def start_answer(self, text: str | None) -> None:
        """Show the user's turn (live) and start the worker; replay turns appear with their RunStarted."""
        if text is not None and not self.source.replay:
            self.messages.append({"role": "user", "content": text})
            self.add_turn(text)
            self.turn_shown = True
            self.answer.note = "loading model..." if self.source.decode is None else ""
            self.answer.refresh_text()
        self.control = RunControl(k=None if self.source.replay else self.next_k)
        self.query_one(PromptArea).disabled = True
        self.refresh_bindings()
        self.generation = self.generate(list(self.messages), self.control)

    def add_turn(self, user_text: str) -> None:
        log = self.query_one("#log", VerticalScroll)
        self.answer = Answer(decode=self.source.decode, mode=self.mode, special=self.source.special, classes="answer")
        log.mount(Static(user_text, classes="user", markup=False), self.answer, self.answer.strip)
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
        # idle until the next turn (which cancels this worker): the cost model times what it still prices from
        # a model, one forward at a time, so the next answer waits one forward at most
        self.source.refine_idle(lambda: worker.is_cancelled)

    def on_events_arrived(self, message: EventsArrived) -> None:
        for event in message.events:
            self.chat_events.append(event)
            if isinstance(event, RunStarted):
                if not self.turn_shown:  # replayed or resumed turns: drawn from the recording
                    self.add_turn(event.prompt_text or "(recorded prompt)")
                    self.messages.append({"role": "user", "content": event.prompt_text})
                self.turn_shown = False
                self.show_warnings(event.warnings)
            self.figures.consume(event)
            if self.answer is not None:
                self.answer.transcript.decode = self.source.decode  # the tokenizer exists once the model has loaded
                self.answer.special = self.source.special
                self.answer.consume(event)
                self.answer.note = self.progress_note(event, self.answer.note)
                if isinstance(event, RunFinished):  # did it pay: the CLI summary's estimate, under the answer
                    self.answer.note = paid_note(self.figures, self.answer.note)
            if isinstance(event, RunFinished):
                self.end_turn(event.text)
        self.redraw()

    def show_warnings(self, warnings: list[str]) -> None:
        """A setting the cost model predicts slower than plain (specpipe/advice.py): a notice, once per chat
        session, as the CLI prints `specpipe: warning: ...` once per run; the panel's row and F2 keep it."""
        for warning in warnings:
            if warning not in self.warned:
                self.warned.add(warning)
                self.notify(warning, title="predicted slower than plain", severity="warning", timeout=30, markup=False)

    def end_turn(self, text: str) -> None:
        """The answer joins the history; an empty one leaves its question unanswered (sent again next time)."""
        if text:
            self.messages.append({"role": "assistant", "content": text})
        elif self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()

    @staticmethod
    def progress_note(event, note: str) -> str:
        """The line under an answer: reading the prompt, then the stop reason or error (none after EOS)."""
        if isinstance(event, RunStarted):
            return f"reading the prompt ({len(event.prompt_ids)} tokens)..."
        if isinstance(event, PrefillProgress):
            return f"reading the prompt ({event.tokens}/{event.total} tokens)..."
        if isinstance(event, (PrefillDone, Emitted)):
            return ""  # a server's stream has no PrefillDone: its first text ends the prompt's reading
        if isinstance(event, RunFinished):
            return f"[{event.stop_reason}]" if event.stop_reason != "eos" else ""
        if isinstance(event, RunError):
            return f"error: {event.message}"
        return note

    def on_generation_failed(self, message: GenerationFailed) -> None:
        if self.answer is not None:
            self.answer.note = f"error: {message.message}"
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()  # unanswered: let the user send it again
        self.turn_shown = False
        self.notify(message.message, title="generation failed", severity="error", timeout=10)
        self.redraw()

    def on_generation_ended(self, message: GenerationEnded) -> None:
        self.control = None
        prompt = self.query_one(PromptArea)
        prompt.disabled = False
        prompt.focus()
        self.refresh_bindings()

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
        if len(self.screen_stack) > 1 and action not in ("quit", "interrupt"):
            return False  # a dialog is open: its own keys apply
        if action in BROWSER_ONLY or action in BROWSER_REPLACED:
            return self.is_web == (action in BROWSER_ONLY)
        if action in GENERATING_ONLY:
            return self.control is not None  # idle: Escape goes to the input, + and - are typed
        return True

    def action_stop(self) -> None:
        if self.control is not None:
            self.control.stop_requested = True

    def action_interrupt(self) -> None:
        """Ctrl+C as in a shell: stop the answer; else copy a selection;
        else clear the line; else quit on a second press."""
        if self.control is not None:
            self.action_stop()
            return
        if len(self.screen_stack) > 1:
            self.pop_screen()
            return
        selected = self.screen.get_selected_text()
        if selected:
            self.copy_to_clipboard(selected)
            self.screen.clear_selection()
            self.notify("copied the selection")
            return
        prompt = self.query_one(PromptArea)
        if prompt.value:
            prompt.clear()
            return
        if time.monotonic() - self.quit_armed_at < QUIT_AGAIN_S:
            self.exit()  # idle: no answer is running
            return
        self.quit_armed_at = time.monotonic()
        self.notify("press Ctrl+C again to quit (or Ctrl+Q)", timeout=QUIT_AGAIN_S)

    async def action_quit(self, return_code: int = 0) -> None:
        """Stop the answer and let the pipeline end its run (RunFinished reaches the recording), then exit."""
        self.action_stop()
        if self.generation is not None and not self.generation.is_finished:
            with contextlib.suppress(asyncio.TimeoutError, WorkerFailed, WorkerCancelled):
                await asyncio.wait_for(self.generation.wait(), QUIT_WAIT_S)
        self.exit(return_code=return_code)

    def on_signal(self, return_code: int) -> None:
        """SIGINT / SIGTERM (from `kill`, not the keyboard): quit as Ctrl+Q does, exiting 130 / 143."""
        self.run_worker(self.action_quit(return_code), group="quit")

    def handle_signals(self, on: bool = True) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # no signals here (Windows, a thread)
            loop = asyncio.get_running_loop()
            for sig, code in SIGNAL_EXIT.items():
                if on:
                    loop.add_signal_handler(sig, self.on_signal, code)
                else:
                    loop.remove_signal_handler(sig)

    def on_unmount(self) -> None:
        self.handle_signals(on=False)

    def action_new_chat(self) -> None:
        self.action_stop()
        self.workers.cancel_all()
        self.messages, self.chat_events, self.figures, self.answer = [], [], Figures(), None
        self.turn_shown = False
        self.query_one("#log", VerticalScroll).remove_children()
        self.redraw()
        if self.source.replay:
            self.notify("Enter replays the recording")

    def action_web_new_chat(self) -> None:
        self.action_new_chat()

    def action_web_cycle_view(self) -> None:
        self.action_cycle_view()

    def action_change_k(self, delta: int) -> None:
        if self.source.replay:
            self.notify("replay: K is as recorded")
            return
        base = self.next_k if self.next_k is not None else (self.figures.k or 0)
        self.next_k = max(0, min(MAX_K, base + delta))
        if self.control is not None:
            self.control.k = self.next_k  # takes effect from the next step of this answer
            if not self.source.k_live:
                self.notify(f"K={self.next_k} reaches the server with the next answer")
        self.redraw()

    def action_change_k_typed(self, delta: int) -> None:
        self.action_change_k(delta)

    def action_cycle_view(self) -> None:
        self.mode = MODES[(MODES.index(self.mode) + 1) % len(MODES)]
        for view in [*self.query(Answer), self.query_one(Legend)]:
            view.mode = self.mode
            view.refresh_text()

    def action_copy_answer(self) -> None:
        """The latest answer, without rejected drafts or special tokens, to the clipboard (OSC 52)."""
        if self.answer is None or not self.answer.answer:
            self.notify("no answer to copy yet")
            return
        self.copy_to_clipboard(self.answer.answer)
        self.notify(f"copied the answer ({len(self.answer.answer)} characters)")

    def action_save(self) -> None:
        if not self.chat_events:
            self.notify("nothing to save yet")
            return
        path = self.save_dir / f"chat-{datetime.now():%Y%m%d-%H%M%S}.jsonl"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            writer = EventWriter(path)
            for event in self.chat_events:
                writer.write(event)
            writer.close()
        except OSError as exc:
            self.notify(f"cannot save {path}: {exc}", severity="error", timeout=10)
            return
        self.notify(f"saved {path}\nspecpipe-chat --resume {path} continues it", timeout=10)

    def action_show_config(self) -> None:
        config = self.figures.config_yaml or self.source.config_yaml
        notes = "".join(f"# warning: {w}\n" for w in self.figures.warnings)  # YAML comments: the view stays YAML
        self.push_screen(ConfigScreen(notes + config if config else notes))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())
