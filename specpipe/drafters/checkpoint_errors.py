"""One line for a checkpoint folder whose values a reader's own checks did not foresee.

Contract: `@one_line_errors` on a loader `load(path, ...)` turns the TypeError / ValueError / AttributeError /
KeyError / IndexError / OverflowError that a config value of the wrong type or range raises deep inside
mlx-lm or MLX (`rms_norm_eps: 0`, `rope_parameters: 7`, `layer_types` cut short) into a SpecpipeError naming the
folder and the error's first line. SpecpipeError passes unchanged; nothing else is caught.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from specpipe.errors import SpecpipeError

Loader = TypeVar("Loader", bound=Callable[..., Any])
UNFORESEEN = (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError)


def one_line_errors(load: Loader) -> Loader:
    @functools.wraps(load)
    def guarded(path, *args, **kwargs):
        try:
            return load(path, *args, **kwargs)
        except UNFORESEEN as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise SpecpipeError(
                f"{path}: its config.json or weights hold a value this reader cannot build a drafter from "
                f"({type(exc).__name__}: {first}); re-download or re-export the checkpoint folder"
            ) from None

    return guarded  # type: ignore[return-value]
