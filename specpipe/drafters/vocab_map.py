"""`draft.vocab_map`: the bytes each token stands for, and the tokens two tokenizers share.

A draft model from another family numbers its tokens differently. What two tokenizers can agree on
is the text a token stands for, so every token is reduced to the bytes it decodes to:

- byte-level BPE (GPT-2, Qwen, SmolLM2, specpipe's tiny byte tokenizer): each character of the token
  string is one byte through GPT-2's byte-to-unicode table ("Ġ" is a space, "Ċ" a newline);
- SentencePiece ("▁" marks a space, "<0x0A>" is a byte token): "▁" becomes a space, "<0xNN>" its byte;
- added and special tokens ("<|im_end|>") are their literal content, and match only an added token
  with the same content in the other vocabulary.

Two ids are *shared* when they decode to the same bytes (the lowest id where a vocabulary has two
tokens for the same bytes) and both lie inside their model's logit rows. `intersection` drafts only
over those; `text` goes through the bytes instead (drafters/cross_vocab.py).

A tokenizer whose ids do not concatenate back to the text they encode (a SentencePiece tokenizer
that adds a space in front, a lossy normaliser) cannot be kept in step with the other, and is
refused before the first forward, as is a pair that shares no token.
"""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import numpy as np

from specpipe.errors import SpecpipeError

METHODS = ("auto", "intersection", "text")
# auto takes intersection when the shared tokens carry at least this share of the target's tokens on the
# draft-vocabulary corpus (Python sources and Markdown, drafters/draft_vocab.py), else text
AUTO_COVERAGE = 0.5
# round-trip probe: code, prose, a newline and indentation, non-ASCII (a char split over byte tokens)
PROBE = 'def add(a, b):\n    """Sum two numbers."""\n    return a + b  # café, naïve ✓\n\nThe end.'


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's unicode-to-byte table (the inverse of its bytes_to_unicode)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    extra = 0
    table = {}
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def token_bytes(tokenizer) -> tuple[list[bytes], set[int]]:
    """Per id (up to the largest id) the bytes it decodes to, and the ids that are added / special tokens.

    Example (byte-level): "Ġworld" -> b" world"; "<|im_end|>" (added) -> b"<|im_end|>", in the set."""
    vocab: dict[str, int] = tokenizer.get_vocab()
    added = {int(i): str(t) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    size = max(vocab.values()) + 1
    out = [b""] * size
    strings = vocab.keys()
    byte_level = any("Ġ" in s for s in strings)
    sentencepiece = not byte_level and any(s.startswith("▁") for s in strings)
    decoder = _byte_decoder()
    for token, idx in vocab.items():
        if idx in added:
            out[idx] = added[idx].encode()
        elif byte_level and all(c in decoder for c in token):
            out[idx] = bytes(decoder[c] for c in token)
        elif sentencepiece and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            out[idx] = bytes([int(token[3:5], 16)])
        elif sentencepiece:
            out[idx] = token.replace("▁", " ").encode()
        else:
            out[idx] = token.encode()
    return out, set(added)


def encode(tokenizer, text: str) -> list[int]:
    """`text` as ids, with no BOS / special tokens added around it."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_bytes(
    tokenizer, data: bytes, table: list[bytes], singles: dict[int, int], placeholder: int | None = None
) -> tuple[list[int], list[int]] | None:
    """`data` as ids and the bytes each stands for: its UTF-8 runs through the tokenizer, any byte outside a
    whole character (a character split between tokens, a random model's output) or of a run that does not
    come back byte for byte as the vocabulary's one-byte token. A byte the vocabulary has no token for
    becomes `placeholder` (standing for that byte); with no placeholder the answer is None.

    Example (byte-level): b"ab\xc3" -> (encode("ab") + [the id of the token for byte 0xC3], [1, 1, 1])."""
    ids: list[int] = []
    lens: list[int] = []

    def single_bytes(chunk: bytes) -> bool:
        for b in chunk:
            token = singles.get(b, placeholder)
            if token is None:
                return False
            ids.append(token)
            lens.append(1)
        return True

    i = 0
    while i < len(data):
        try:
            text, bad = data[i:].decode(), None
        except UnicodeDecodeError as exc:
            text, bad = data[i : i + exc.start].decode(), (i + exc.start, i + exc.end)
        if text:
            run = encode(tokenizer, text)
            sizes = [len(table[t]) if 0 <= t < len(table) else 0 for t in run]
            if b"".join(table[t] for t in run if 0 <= t < len(table)) == text.encode():
                ids += run
                lens += sizes
            elif not single_bytes(text.encode()):
                return None
        if bad is None:
            break
        if not single_bytes(data[bad[0] : bad[1]]):
            return None
        i = bad[1]
    return ids, lens


def check_round_trip(tokenizer, table: list[bytes], name: str) -> None:
    """Refuse a tokenizer whose ids' bytes do not give back the text they encode (one line)."""
    ids = encode(tokenizer, PROBE)
    back = b"".join(table[i] if 0 <= i < len(table) else b"?" for i in ids)
    if back != PROBE.encode():
        raise SpecpipeError(
            f"draft.vocab_map: {name}'s tokenizer does not round-trip text through its tokens' bytes "
            f"({PROBE[:12]!r}... comes back as {back[:12]!r}...), so the draft cannot be kept in step with the "
            "target: pick a draft model with a byte-level BPE tokenizer, or draft=ngram"
        )


class VocabMap:
    """The ids two models share (same bytes), and the draft distribution moved to the target's ids.

    Example: target vocab ["a", "b", "c"], draft ["c", "x", "a"] -> shared draft ids [0, 2] <-> target [2, 0];
    a draft q over [c, x, a] of [0.25, 0, 0.75] becomes [0.75, 0, 0.25] over the target's [a, b, c]."""

    def __init__(self, target, draft):
        t_table, t_added = token_bytes(target.tokenizer)
        d_table, d_added = token_bytes(draft.tokenizer)
        self.target_bytes, self.draft_bytes = t_table, d_table
        t_rows = min(target.vocab_size or len(t_table), len(t_table))
        d_rows = min(draft.vocab_size or len(d_table), len(d_table))
        self.target_rows = target.vocab_size or len(t_table)  # the width of the target's logits
        self.draft_rows = draft.vocab_size or len(d_table)

        def keyed(table, added, rows):
            keys: dict[tuple[bool, bytes], int] = {}
            for i in range(rows):
                if table[i]:
                    keys.setdefault((i in added, table[i]), i)  # the lowest id of two with the same bytes
            return keys

        t_keys = keyed(t_table, t_added, t_rows)
        d_keys = keyed(d_table, d_added, d_rows)
        # each byte's one-byte token: what a byte outside any whole character is encoded as (encode_bytes)
        self.target_singles = {key[1][0]: i for key, i in t_keys.items() if not key[0] and len(key[1]) == 1}
        self.draft_singles = {key[1][0]: i for key, i in d_keys.items() if not key[0] and len(key[1]) == 1}
        pairs = sorted((d, t_keys[key]) for key, d in d_keys.items() if key in t_keys)
        self.draft_ids = np.array([d for d, _ in pairs], dtype=np.int64)
        self.target_ids = np.array([t for _, t in pairs], dtype=np.int64)
        self.shared = len(pairs)
        self.d2t = np.full(self.draft_rows, -1, dtype=np.int64)
        self.d2t[self.draft_ids] = self.target_ids
        # draft logits + mask: -inf outside the shared ids, so the draft proposes (and samples) only those
        mask = np.full(self.draft_rows, -np.inf, dtype=np.float32)
        mask[self.draft_ids] = 0.0
        self.mask = mx.array(mask)[None, :]
        # q over the target's rows by one gather: target id -> its draft id, or the appended zero column
        inv = np.full(self.target_rows, self.draft_rows, dtype=np.int64)
        inv[self.target_ids] = self.draft_ids
        self._inv = mx.array(inv.astype(np.uint32))

    def to_target(self, q: mx.array) -> mx.array:
        """[n, draft rows] probabilities -> [n, target rows]: each shared id's mass at its target id, 0 elsewhere."""
        padded = mx.concatenate([q, mx.zeros((q.shape[0], 1), dtype=q.dtype)], axis=-1)
        return padded[:, self._inv]

    def coverage(self, counts: np.ndarray) -> float:
        """The share of the target's tokens (`counts` per target id, on a corpus) the draft can propose."""
        total = float(counts.sum())
        ids = self.target_ids[self.target_ids < len(counts)]
        return float(counts[ids].sum()) / total if total > 0 else 0.0


def choose(method: str, vmap: VocabMap, target_tokenizer) -> tuple[str, float | None]:
    """The method a run uses for `draft.vocab_map=method`, and the coverage auto judged it by (None: not asked)."""
    if method not in METHODS:
        raise SpecpipeError(f"draft.vocab_map={method} is not one of {', '.join(METHODS)}")
    if method != "auto":
        return method, None
    from specpipe.drafters.draft_vocab import _counts  # the corpus count the cut draft head ranks ids by

    share = vmap.coverage(_counts(target_tokenizer))
    return ("intersection" if share >= AUTO_COVERAGE else "text"), share
