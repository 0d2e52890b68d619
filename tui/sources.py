"""Event sources: where the app's events come from.

A source has `generate(messages, control) -> Iterator[Event]` (one answer:
RunStarted ... RunFinished), `decode` (ids -> text, or None), `special` (the
special-token pattern), `k` (the configured draft budget, or None) and
`config_yaml`, and `refine_idle(should_stop)`, called between answers (the cost
model's idle timing; a no-op where no model runs here). `LiveSource` runs a Session (loaded lazily, on the worker
thread: this module never imports mlx) and applies the prompt group as the
`specpipe` CLI does (`prompt.system`, `prompt.chat`); `ReplaySource` plays
recorded events at their original pace or faster. `chat_history` turns
recorded events back into chat messages, so a saved chat can be resumed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

from specpipe.events import Event, EventWriter, RunFinished, RunStarted, read_recording
from specpipe.metrics import StatsCollector
from tui.transcript import SPECIAL, special_pattern


def chat_history(events: list[Event]) -> list[dict]:
    """Chat messages of recorded answers: each run's prompt_text, then its answer.

    Runs that ended without an answer (an error, or stopped before a token)
    are left out, as the live chat drops an unanswered turn.
    """
    messages, prompt = [], None
    for event in events:
        if isinstance(event, RunStarted):
            prompt = event.prompt_text
        elif isinstance(event, RunFinished) and prompt is not None and event.text:
            messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": event.text}]
            prompt = None
    return messages


class LiveSource:
    """Generates with a Session built from the composed config.

    Args:
        cfg: the composed Hydra config (as `specpipe` gets it).
        record_to: optional events.jsonl path; every answer's events are appended,
            so `specpipe-chat --replay` can play the whole chat back.
    """

    replay = False
    k_live = True  # a K changed mid-answer applies from this answer's next step

    def __init__(self, cfg, record_to: str | Path | None = None):
        from omegaconf import OmegaConf

        self.cfg = cfg
        self.config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
        self.k = cfg.budget.get("k")
        self.session = None
        self._special = None
        self._writer = EventWriter(record_to) if record_to else None
        self._engine = threading.Lock()  # one forward at a time: an answer's or an idle refinement's

    @property
    def decode(self):
        return self.session.target.decode if self.session is not None else None

    @property
    def special(self):
        """The tokenizer's own special tokens once the model is loaded, else the default shapes."""
        if self._special is None and self.session is not None:
            self._special = special_pattern(tokenizer_specials(self.session.target.tokenizer))
        return self._special or SPECIAL

    def load(self):
        """Build the Session once (slow: loads the models). Raises SpecpipeError."""
        if self.session is None:
            from specpipe.run.session import Session

            self.session = Session(self.cfg)
        return self.session

    def prompt_messages(self, messages: list[dict]) -> list[dict]:
        """The chat as the model sees it: `prompt.system` first, when set (as `specpipe` does)."""
        system = self.cfg.prompt.get("system")
        return [{"role": "system", "content": system}, *messages] if system else list(messages)

    def encode(self, session, messages: list[dict]) -> list[int]:
        """Prompt ids; `prompt.chat=false` sends the last message as raw text (no template, no history)."""
        if not self.cfg.prompt.get("chat", True):
            return session.encode(text=messages[-1]["content"])
        return session.encode(messages=self.prompt_messages(messages))

    def generate(self, messages: list[dict], control) -> Iterator[Event]:
        with self._engine:  # after refine_idle's forward, never beside it
            session = self.load()
            prompt_ids = self.encode(session, messages)
            for event in session.generate(prompt_ids, control=control, prompt_text=messages[-1]["content"]):
                self.record(event)
                yield event

    def refine_idle(self, should_stop) -> None:
        """Between turns: budget=auto's long-context verify curves, timed until `should_stop()` (a new turn)."""
        from specpipe.costmodel.refine import refine_idle

        if self.session is not None:
            with self._engine:
                refine_idle(self.session.target, self.session.budget, should_stop)

    def record(self, event: Event) -> None:
        if self._writer:
            self._writer.write(event)

    def close(self) -> None:
        if self._writer:
            self._writer.close()


def tokenizer_specials(tokenizer) -> list[str]:
    """Special token strings of an HF tokenizer (mlx-lm's wrapper forwards attributes); [] if it has none."""
    try:
        words = list(getattr(tokenizer, "all_special_tokens", []) or [])
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        words += [str(t) for t in added.values() if getattr(t, "special", False)]
    except Exception:  # noqa: BLE001  (a tokenizer without these attributes: the default shapes still apply)
        return []
    return words


class ReplaySource:
    """Plays recorded runs (one events.jsonl may hold several answers of a chat).

    Args:
        events: the recorded events, in order.
        speed: 1 plays at the recorded pace, 2 twice as fast, 0 instantly.
    """

    replay = True
    k_live = False  # K is as recorded
    decode = None
    special = SPECIAL

    def __init__(self, events: list[Event], speed: float = 1.0):
        if speed < 0:
            raise ValueError(f"speed={speed}: must be 0 (instant) or more")
        self.events, self.speed = list(events), speed
        started = next((e for e in self.events if isinstance(e, RunStarted)), None)
        if started is None:
            raise ValueError("the recording has no RunStarted event: is it an events.jsonl?")
        self.config_yaml = started.config_yaml
        self.k = None

    @classmethod
    def from_file(cls, path: str | Path, speed: float = 1.0) -> ReplaySource:
        """A recording as a crash or full disk may leave it: a torn last line is skipped, with a notice on stderr."""
        events, notice = read_recording(path)
        if notice:
            import sys

            print(f"specpipe-chat: {notice}", file=sys.stderr)
        return cls(events, speed)

    def prompts(self) -> list[str]:
        return [e.prompt_text for e in self.events if isinstance(e, RunStarted)]

    def generate(self, messages: list[dict], control) -> Iterator[Event]:
        """All recorded runs in order; `messages` is ignored. A stop ends the replay."""
        collector, start = StatsCollector(), time.monotonic()
        for event in self.events:
            if isinstance(event, RunStarted):
                collector, start = StatsCollector(), time.monotonic()  # each run's `t` restarts at 0
            if not self._wait_until(start + event.t / self.speed if self.speed else 0.0, control):
                # End the answer as the pipeline does on a stop: a RunFinished with what was shown.
                yield RunFinished(
                    t=event.t,
                    stop_reason="stopped",
                    token_ids=collector.token_ids,
                    text=collector.text,
                    stats=collector.stats(),
                )
                return
            collector.consume(event)
            yield event

    def refine_idle(self, should_stop) -> None:
        pass  # a recording runs no model

    @staticmethod
    def _wait_until(deadline: float, control) -> bool:
        """Sleep in short slices so a stop lands at once; False if stopped."""
        while not control.stop_requested:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, 0.02))
        return False
