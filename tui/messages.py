"""Textual messages posted by the generation worker to the app (thread-safe via post_message)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message


@dataclass
class EventsArrived(Message):
    """A batch of pipeline events (at least one step's worth, coalesced for fast streams)."""

    events: list


@dataclass
class GenerationFailed(Message):
    """The source raised (model failed to load, out of memory, ...): a one-line reason."""

    message: str


@dataclass
class GenerationEnded(Message):
    """The worker finished, whatever the outcome; the input may be used again."""
