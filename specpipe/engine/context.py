"""Whether a run fits the model's context: the prompt, and the prompt plus what it may generate.

Contract: `overflow_message(engine, n_prompt, max_tokens)` returns one actionable line naming the
numbers (prompt tokens, max_tokens, the model's context) when the run would pass the positions the
model was trained for, else None; `check_room` raises it as a SpecpipeError. Checked before the
first forward, so a long prompt is refused in a second, not after minutes of prefill. It never
runs a forward. A model with no fixed context (recurrent) always fits.

Worked example (context 8192): a 8000-token prompt with max_tokens=128 needs positions up to
8000 + 128 = 8128 <= 8192, so it runs; with max_tokens=256 (8256) it is refused, and the line says
max_tokens=192 would fit. `kv=window` lifts the prompt-plus-answer limit (attention never spans
more than `kv.size` positions, as mlx-lm's rotating cache generates past the context), but not the
prompt's own: a prompt past the context is refused with every cache.
"""

from __future__ import annotations

from specpipe.errors import SpecpipeError


def overflow_message(engine, n_prompt: int, max_tokens: int) -> str | None:
    """One line when `n_prompt` tokens plus `max_tokens` generated ones pass `engine`'s context.

    Args:
        engine: the target (or draft) Engine; its `context_length` and KV policy (`engine.kv`) decide.
        n_prompt: prompt tokens.
        max_tokens: the most tokens the run may generate.
    """
    limit = engine.context_length
    if not limit:
        return None
    name = engine.info.name
    if n_prompt >= limit:
        return (
            f"the prompt is {n_prompt} tokens but {name}'s context is {limit} tokens: "
            f"shorten the prompt to under {limit} tokens, or use a model with a longer context"
        )
    windowed = engine.kv is not None and engine.kv.name == "window"
    if n_prompt + max_tokens > limit and not windowed:
        return (
            f"the prompt ({n_prompt} tokens) plus max_tokens={max_tokens} is {n_prompt + max_tokens} tokens, "
            f"past {name}'s context of {limit} tokens: set max_tokens={limit - n_prompt} or less, "
            "shorten the prompt, or use kv=window (attention over the last kv.size positions)"
        )
    return None


def check_room(engine, n_prompt: int, max_tokens: int) -> None:
    """Raise overflow_message's line as a SpecpipeError (exit 1: the config was fine, this prompt is not)."""
    message = overflow_message(engine, n_prompt, max_tokens)
    if message:
        raise SpecpipeError(message)
