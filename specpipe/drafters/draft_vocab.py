"""`draft.vocab=N`: the draft model's LM head scores N token ids, not the whole vocabulary.

A draft token's cost is the weight bytes it reads, and the LM head is a large share of a small
model's: Qwen2.5-0.5B's tied head (151,936 x 896) is 27% of its weights, and on this CPU a
draft token took ~25% less time with a 32k-row head (docs/benchmarks/log/2026-12-01-draft-head-cut.md).
The draft only has to
guess what the target will say, and that is nearly always a frequent token or one already in the
context (FR-Spec, Zhao et al. 2025, restricts the draft head the same way). So the head keeps:

- the N ids most frequent in text like a code assistant's answers: Python's own standard library
  (code, comments, docstrings: ~2 MB read in sorted file order) and a line of Markdown (fences,
  lists, emphasis), counted once per tokenizer and cached on disk; ids that text never uses
  fill the rest in id order (byte-level BPE numbers merges roughly by frequency, but only
  roughly: Qwen's "```" is id 73594);
- every id of the prompt and of the output so far (an identifier the edit renames, a rare word),
  with its case and leading-space variants (" clamp" in the prompt keeps "clamp", " Clamp" and "Clamp");
- the end-of-sequence ids, so the draft can still propose stopping.

The target scores the full vocabulary, so the output is unchanged: greedy verification keeps the
target's argmax; under sampling the draft distribution q is zero outside the set, and rejection
sampling is exact for any q. What a smaller set can cost is acceptance, never correctness.

Example: frequent rows [0, 1, 2, 3], vocab 10, eos 9, prompt [2, 7] -> rows 0, 1, 2, 3, 9, 7;
logits come back [.., 10] with -inf at 4, 5, 6 and 8.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specpipe.costmodel.weights import weight_bytes
from specpipe.engine import introspect
from specpipe.engine.load.model_store import cache_dir
from specpipe.errors import SpecpipeError


class DraftVocab:
    """The rows of a draft model's LM head that a draft may propose, and logits over only those."""

    def __init__(self, head: nn.Module, frequent: Iterable[int], always: Iterable[int], tokenizer=None):
        """
        Args:
            head: the module whose weight rows are the LM head's (`head_module`).
            frequent: the rows kept whatever the context (`frequent_ids`).
            always: ids kept as well (end of sequence).
            tokenizer: to keep the case and leading-space variants of context ids (None: the ids alone).
        """
        self._head = head
        self._variants = Variants(tokenizer) if tokenizer is not None else None
        self.vocab = int(head.weight.shape[0])
        base = sorted({i for i in (*frequent, *always) if 0 <= i < self.vocab})
        self._base_ids = mx.array(base, dtype=mx.uint32)
        self._base = self._slice(self._base_ids)
        mx.eval(self._base)  # one gathered copy of the kept rows, read by every draft token
        self._base_set = set(base)
        self.reset([])

    def fork(self) -> DraftVocab:
        """A DraftVocab of its own for another drafter on the same head: the gathered frequent rows and the
        variants are shared (read-only), the context's extra rows start empty."""
        twin = copy.copy(self)
        twin.reset([])
        return twin

    def reset(self, context_ids: Iterable[int]) -> None:
        """Start a new generation: the frequent rows, the end ids and `context_ids`."""
        self._extra: list[int] = []
        self._known: set[int] = set()
        self._extra_rows: tuple | None = None
        self.add(context_ids)

    def add(self, ids: Iterable[int]) -> None:
        """Keep the rows of `ids` too (the target emitted or the prompt holds them), and their variants."""
        ids = set(ids) - self._known
        if self._variants is not None:
            ids |= self._variants.of(ids)
        new = {i for i in ids if 0 <= i < self.vocab and i not in self._base_set and i not in self._known}
        if new:
            self._known |= new
            self._extra.extend(sorted(new))
            self._extra_rows = None  # gathered again on the next logits call

    def ids(self) -> set[int]:
        """The ids a draft can propose now."""
        return self._base_set | self._known

    @property
    def base_rows(self) -> int:
        """How many rows are kept whatever the context (the frequent ids and the end ids)."""
        return len(self._base_set)

    @property
    def rows(self) -> int:
        """How many head rows a draft token reads."""
        return len(self._base_set) + len(self._extra)

    def bytes_share(self, model_bytes: int) -> float:
        """The share of a full draft forward's weight bytes (`model_bytes`) a draft token reads now."""
        head_bytes = weight_bytes(self._head)
        return max(0.0, 1.0 - head_bytes * (1.0 - self.rows / self.vocab) / model_bytes)

    def logits(self, hidden: mx.array) -> mx.array:
        """[n, vocab] float32 logits of the kept rows for hidden states [n, hidden]; -inf elsewhere."""
        base = self._matmul(hidden, self._base)
        full = mx.full((hidden.shape[0], self.vocab), -mx.inf, dtype=base.dtype)
        full[:, self._base_ids] = base
        if self._extra:
            if self._extra_rows is None:  # gathered when ids joined, not once per drafted token
                self._extra_index = mx.array(self._extra, dtype=mx.uint32)
                self._extra_rows = self._slice(self._extra_index)
                mx.eval(self._extra_index, self._extra_rows)
            full[:, self._extra_index] = self._matmul(hidden, self._extra_rows)
        return full.astype(mx.float32)

    def _slice(self, rows) -> tuple:
        head = self._head
        if isinstance(head, nn.QuantizedLinear | nn.QuantizedEmbedding):
            biases = getattr(head, "biases", None)  # quantization modes without biases (mxfp4) have none
            return head.weight[rows], head.scales[rows], biases[rows] if biases is not None else None
        return (head.weight[rows],)

    def _matmul(self, hidden: mx.array, part: tuple) -> mx.array:
        head = self._head
        if len(part) == 1:
            return hidden @ part[0].T
        w, scales, biases = part
        return mx.quantized_matmul(
            hidden,
            w,
            scales,
            biases,
            transpose=True,
            group_size=head.group_size,
            bits=head.bits,
            mode=getattr(head, "mode", "affine"),
        )


def head_module(model: nn.Module, inner: nn.Module, setting: str) -> nn.Module:
    """The module whose weight rows are `model`'s LM head (lm_head, or the tied embeddings).

    `inner` is the model's inner stack (Engine.hidden_parts, which has checked that the logits are
    exactly the head over its output). Raises SpecpipeError, naming `setting`, for any other head.
    """
    head = introspect.lm_head_weights(model, inner)
    kinds = (nn.Linear, nn.Embedding, nn.QuantizedLinear, nn.QuantizedEmbedding)
    if not isinstance(head, kinds) or "bias" in head:
        raise SpecpipeError(
            f"{setting}: the draft model's LM head is a {type(head).__name__} with a bias or of another kind, "
            "so its rows cannot be picked; use draft.vocab=0"
        )
    return head


class Variants:
    """Ids of a token's case and leading-space variants, read from the tokenizer's vocabulary."""

    SPACES = ("Ġ", "▁")  # how byte-level BPE and SentencePiece vocabularies spell a leading space

    def __init__(self, tokenizer):
        self._vocab = tokenizer.get_vocab()
        self._strings = {i: s for s, i in self._vocab.items()}

    def of(self, ids: Iterable[int]) -> set[int]:
        found = set()
        for i in ids:
            s = self._strings.get(i)
            if not s:
                continue
            space = next((p for p in self.SPACES if s.startswith(p)), "")
            word = s[len(space) :]
            if not word[:1].isalpha():
                continue
            for w in {word, word.lower(), word.capitalize(), word[:1].swapcase() + word[1:]}:
                for prefix in {"", *(p for p in self.SPACES if p == space or not space)}:
                    j = self._vocab.get(prefix + w)
                    if j is not None:
                        found.add(j)
        return found


# ---------------------------------------------------------------- which ids are frequent

CORPUS_CHARS = 2_000_000  # of the standard library's sources: ~1.5 s to count once per tokenizer
MARKDOWN = (  # what chat answers wrap code and lists in
    "```python\n```\n\n```bash\n```json\n**Note:** use `x`.\n\n- a\n- b\n1. c\n2. d\n### Example\n> e\n"
    "| a | b |\n|---|---|\n"
)


def frequent_ids(tokenizer, n: int) -> list[int]:
    """The `n` ids most used in the standard library's sources and a line of Markdown, most used first,
    then the lowest unused ids; cached on disk per tokenizer vocabulary and Python version."""
    counts = _counts(tokenizer)
    ranked = [int(i) for i in np.argsort(-counts, kind="stable")[: np.count_nonzero(counts)]][:n]
    if len(ranked) < n:
        used = set(ranked)
        ranked += [i for i in range(len(counts)) if i not in used][: n - len(ranked)]
    return ranked


def _counts(tokenizer) -> np.ndarray:
    """Occurrences of each id in the corpus (an array over the tokenizer's ids)."""
    vocab = tokenizer.get_vocab()
    size = max(vocab.values()) + 1
    digest = hashlib.sha256(json.dumps(sorted(vocab.items())).encode())
    digest.update(f"{sys.version_info[:2]} {CORPUS_CHARS} {MARKDOWN}".encode())
    path = cache_dir() / "draft_vocab" / f"{digest.hexdigest()[:16]}.npy"
    try:
        return np.load(path)
    except Exception:  # noqa: BLE001  (missing, torn or foreign: any unreadable cache is counted again)
        pass
    counts = np.zeros(size, dtype=np.int64)
    for text in [MARKDOWN, *_corpus()]:
        ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
        np.add.at(counts, ids[(ids >= 0) & (ids < size)], 1)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")  # two processes counting at once never share one
        np.save(tmp, counts)
        tmp.replace(path)
    except OSError:
        pass  # a read-only or full cache only costs the count again next time
    return counts


def _corpus():
    """The standard library's .py sources in sorted order, up to CORPUS_CHARS characters."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8", errors="ignore")
        except OSError:
            continue
        yield text
        total += len(text)
        if total >= CORPUS_CHARS:
            return
