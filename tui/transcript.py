"""Events -> styled pieces of one answer (pure: no Textual, no mlx).

Feed a run's events to `AnswerTranscript.consume`; `pieces` is the answer as
(text, kind) runs in reading order. Per step that is: the accepted draft
tokens, then the rejected draft span (never part of the answer; the full view
shows it struck through), then the target's own token (recovered at the first
rejection, or the bonus after a fully accepted draft; "target" when nothing
was drafted). `steps` keeps (drafted, accepted) per step for the step strip,
`branches` the paths a token tree tried (tree != chain: the accepted path is
the accepted span; the other branches' nodes are one rejected marker).
Special tokens (`<|im_end|>`, ...) are text in the events; `split_special`
finds them so views can drop or mark them, and `answer` leaves them out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from specpipe.events import Drafted, Emitted, RunStarted, Verified

ACCEPTED, REJECTED, RECOVERED, BONUS, TARGET = "accepted", "rejected", "recovered", "bonus", "target"
KINDS = (ACCEPTED, REJECTED, RECOVERED, BONUS, TARGET)

Decode = Callable[[list[int]], str]

# C0 controls (and DEL) would move the terminal cursor: show their Unicode pictures instead.
_CONTROL_PICTURES = {c: chr(0x2400 + c) for c in range(32) if chr(c) not in "\n\t"} | {127: "\u2421"}


# Chat-template control tokens as text: ChatML / Llama 3 `<|...|>` and Gemma's turn markers. A live
# tokenizer adds its own list (`special_pattern(extra=...)`); replays of any recording use this one.
_SPECIAL_SHAPES = r"<\|[^<>|\s]{1,40}\|>|<(?:start|end)_of_turn>"
SPECIAL = re.compile(_SPECIAL_SHAPES)


def special_pattern(extra: Iterable[str] = ()) -> re.Pattern:
    """The default shapes plus a tokenizer's own special token strings (longest first)."""
    words = sorted({w for w in extra if w and not w.isspace()}, key=len, reverse=True)
    return re.compile("|".join([*(re.escape(w) for w in words), _SPECIAL_SHAPES]))


def split_special(text: str, pattern: re.Pattern = SPECIAL) -> list[tuple[str, bool]]:
    """(segment, is_special) runs of `text`.

    Example: "hi<|im_end|>\n" -> [("hi", False), ("<|im_end|>", True), ("\n", False)].
    """
    runs, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            runs.append((text[pos : m.start()], False))
        runs.append((m.group(), True))
        pos = m.end()
    if pos < len(text):
        runs.append((text[pos:], False))
    return runs


def strip_special(text: str, pattern: re.Pattern = SPECIAL) -> str:
    return pattern.sub("", text)


def printable(text: str) -> str:
    """Random models emit bytes like ESC or BS; make them visible (when drawing), keep newlines and tabs."""
    return text.translate(_CONTROL_PICTURES)


@dataclass(frozen=True)
class Piece:
    text: str
    kind: str  # one of KINDS
    step: int


class AnswerTranscript:
    """The pieces of one answer, built from Verified + Emitted events.

    Args:
        decode: token ids -> text, when a tokenizer is at hand (live runs). Used
            only when the events lack per-token text (`Emitted.token_texts`,
            `Verified.rejected_text`), as in older recordings.
    """

    def __init__(self, decode: Decode | None = None):
        self.decode = decode
        self.pieces: list[Piece] = []
        self.steps: list[tuple[int, int]] = []  # (drafted, accepted) per verified step, in order
        # per verified step, branches a token tree tried (root-to-leaf paths); 0 for a chain step
        self.branches: list[int] = []
        self._verdicts: dict[int, Verified] = {}
        self._trees: dict[int, list[int]] = {}  # step -> Drafted.tree_parents

    def consume(self, event) -> None:
        if isinstance(event, RunStarted):
            self.pieces, self.steps, self.branches, self._verdicts, self._trees = [], [], [], {}, {}
        elif isinstance(event, Drafted) and event.tree_parents:
            self._trees[event.step] = event.tree_parents
        elif isinstance(event, Verified):
            self._verdicts[event.step] = event
            accepted = len(event.accepted_ids)
            parents = self._trees.pop(event.step, [])
            if event.tree_depth:  # a tree: the strip shows the path's share of the tree's depth
                self.steps.append((event.tree_depth, accepted))
                self.branches.append(branch_count(parents))
            else:
                self.steps.append((accepted + len(event.rejected_ids), accepted))
                self.branches.append(0)
        elif isinstance(event, Emitted):
            self.pieces.extend(step_pieces(event, self._verdicts.pop(event.step, None), self.decode))

    @property
    def text(self) -> str:
        """The answer as the model wrote it (rejected drafts excluded)."""
        return "".join(p.text for p in self.pieces if p.kind != REJECTED)

    def answer(self, pattern: re.Pattern = SPECIAL) -> str:
        """What a reader copies: the text without rejected drafts or special tokens."""
        return strip_special(self.text, pattern)


def step_pieces(emitted: Emitted, verified: Verified | None, decode: Decode | None = None) -> list[Piece]:
    """One step's pieces: accepted, rejected, then the target's token.

    Example: draft [a, b, c], target agrees on a, b and says X instead of c:
    Emitted(token_ids=[a, b, X], from_draft=2) -> [Piece("ab", accepted),
    Piece("c", rejected), Piece("X", recovered)].
    """
    step = emitted.step
    accepted_text, target_text = split_text(emitted, decode)
    pieces = []
    if accepted_text:
        pieces.append(Piece(accepted_text, ACCEPTED, step))
    if verified is not None and verified.tree_depth and verified.rejected_ids:
        # a tree's rejected nodes lie on other branches, not after the path: one marker, not their text
        pieces.append(Piece(f"\u27e8{len(verified.rejected_ids)} other nodes\u27e9", REJECTED, step))
    elif verified is not None and verified.rejected_ids:
        rejected = getattr(verified, "rejected_text", "") or (decode(verified.rejected_ids) if decode else "")
        pieces.append(Piece(rejected or f"\u27e8{len(verified.rejected_ids)} rejected\u27e9", REJECTED, step))
    if target_text:
        pieces.append(Piece(target_text, target_kind(verified), step))
    return pieces


def branch_count(parents: list[int]) -> int:
    """Root-to-leaf paths of a tree given each node's parent. Example: [-1, 0, 0, -1] -> 3."""
    inner = set(parents)
    return sum(i not in inner for i in range(len(parents)))


def target_kind(verified: Verified | None) -> str:
    if verified is None or not (verified.accepted_ids or verified.rejected_ids):
        return TARGET  # nothing was drafted: plain decoding
    return BONUS if verified.bonus_id is not None else RECOVERED


def split_text(emitted: Emitted, decode: Decode | None) -> tuple[str, str]:
    """(text of the accepted draft tokens, text of the target token) of one step.

    With `Emitted.token_texts` (one streaming segment per token) the split is
    exact. Without it, the target token's text is found by decoding it alone
    and matching the end of the step's text; failing that, the step is shown
    as one span (its majority kind): an approximation, never a wrong text.
    """
    text, ids, k = emitted.text, emitted.token_ids, emitted.from_draft
    texts = getattr(emitted, "token_texts", None)
    if texts and len(texts) == len(ids):
        return "".join(texts[:k]), "".join(texts[k:])
    if k >= len(ids):
        return text, ""
    if k == 0:
        return "", text
    tail = decode(ids[k:]) if decode else ""
    if tail and text.endswith(tail):
        return text[: len(text) - len(tail)], tail
    return text, ""
