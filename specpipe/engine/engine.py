"""The MLX engine: one loaded model, its tokenizer, its caches, its forwards.

Contract: stages hand it token ids, a cache and what to capture, and get a
`ForwardResult` back: float32 logits, one row per input position, plus the
final hidden states and per-position recurrent states only when asked
(`Capture`). Without a capture a forward is the plain mlx-lm call and
nothing else. It knows nothing of drafting, verification or GGUF files;
loaders (engine/load/loader.py) build it, stages only call it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specpipe.engine import introspect, layer_taps
from specpipe.engine.info import ModelInfo
from specpipe.engine.kv import model_cache
from specpipe.engine.positions import placed
from specpipe.engine.recurrent import StateCapture, StepwiseMixer, stepwise
from specpipe.engine.target_kv import TargetKv

PREFILL_CHUNK = 512  # prompt positions per prefill forward; prefill.chunk sets an engine's own


@dataclass(frozen=True)
class Capture:
    """What a forward should hand back beside the logits.

    hidden: the final hidden states (the LM head's input, after the final
        norm), for drafters that read the target's state (MTP heads).
    states: per-position recurrent states, recorded into this capture
        (recurrent.StateCapture, opened by a rollback strategy).
    layers: decoder-layer taps: the hidden states entering these layers
        (engine/layer_taps.py; N = the last layer's output), for EAGLE-3 heads.
    kv: a TargetKv (engine/target_kv.py) pointed at the cache each recording forward runs on, for drafters
        that attend to the target's own K/V (Gemma-4 assistants).
    """

    hidden: bool = False
    states: StateCapture | None = None
    layers: tuple[int, ...] = ()
    kv: TargetKv | None = None


HIDDEN = Capture(hidden=True)


@dataclass(frozen=True)
class ForwardResult:
    """One forward's outputs (lazy arrays: nothing is evaluated by the engine).

    logits: [n, vocab] float32 ([rows, n, vocab] for batched input).
    hidden: [n, hidden] final hidden states when `Capture.hidden`, else None.
    states: the StateCapture it recorded into, else None.
    layer_hidden: [n, len(layers) * hidden] the tapped layers' inputs side by side when `Capture.layers`, else None.
    """

    logits: mx.array
    hidden: mx.array | None = None
    states: StateCapture | None = None
    layer_hidden: mx.array | None = None


class Engine:
    """A model ready to run forwards.

    Args:
        model: an mlx-lm model (callable as `model(ids[None], cache=cache)`).
        tokenizer: mlx-lm `TokenizerWrapper` (has `.detokenizer`, `.eos_token_ids`).
        info: what was loaded, for reports.
    """

    def __init__(self, model: nn.Module, tokenizer, info: ModelInfo):
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self._parts: tuple[Any, Any] | None = None  # (inner model, LM head), found on the first hidden-state capture
        self._mixers: list[tuple[Any, Any, StepwiseMixer]] | None = (
            None  # [(parent, key, StepwiseMixer)], found on the first state capture
        )
        self._ropes: list | None = None  # the attention layers owning a `rope`, found on the first positioned forward
        self.prefill_chunk = PREFILL_CHUNK
        self.kv = None  # a KV cache policy (engine/kv.py, kv=...); None: the model's own (kv.model_cache)

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self.tokenizer.eos_token_ids or ())

    def make_cache(self) -> list:
        """A fresh per-layer cache (KV for attention, state for recurrent layers), as `kv` chooses.

        Sliding-window and chunked-attention layers get kv.py's WindowKVCache / ExactChunkedKVCache,
        which roll back exactly past the window or chunk.
        """
        return self.kv.make_cache(self.model) if self.kv is not None else model_cache(self.model)

    def forward(
        self, token_ids, cache: list | None, *, capture: Capture | None = None, positions=None, mask=None
    ) -> ForwardResult:
        """Run the model over `token_ids` appended to `cache`.

        Args:
            token_ids: [n] int array (or list) of new positions; [rows, n] for
                a batch of rows with a batched cache.
            cache: the cache from `make_cache`, updated in place (None: no cache).
            capture: what to hand back beside the logits (None: logits only,
                the plain mlx-lm call).
            positions: int [n] / [rows, n], each fed token's absolute (RoPE)
                position (a tree's nodes: offset + depth; a batch's rows: each
                its own offset); None: each row continues its cache.
            mask: bool [n, L] / [rows, n, L], True = may attend, L = the key
                columns the cache held before this forward plus n (column j:
                position j of a plain cache; the last n: the fed tokens); None
                with positions: causal over the fed tokens. Sliding-window
                layers also apply their window from `positions`
                (engine/positions.py has the full contract).

        Returns:
            ForwardResult with lazy arrays (nothing is evaluated here).

        Raises:
            SpecpipeError (one line) when the cache cannot take positions / a
            mask (a recurrent layer under a tree, a quantized or chunked one).
        """
        if not isinstance(token_ids, mx.array):
            token_ids = mx.array(token_ids, dtype=mx.uint32)
        batched = token_ids.ndim == 2
        ids = token_ids if batched else token_ids[None]
        if capture is not None and capture.kv is not None:
            capture.kv.attach(self.model, cache, batched and ids.shape[0] > 1)
        if positions is not None or mask is not None:
            if self._ropes is None:
                self._ropes = introspect.rope_owners(self.model)
            with placed(self._ropes, cache or self.make_cache(), ids.shape[0], ids.shape[1], positions, mask) as fed:
                return self._run(ids, fed, capture, batched)
        return self._run(ids, cache, capture, batched)

    def _run(self, ids: mx.array, cache: list | None, capture: Capture | None, batched: bool) -> ForwardResult:
        if capture is None:  # the fast path: exactly the mlx-lm call
            logits = self.model(ids, cache=cache)
            return ForwardResult(logits=(logits if batched else logits[0]).astype(mx.float32))
        states = capture.states if capture.states else None
        parts = self.hidden_parts() if capture.hidden else None  # before the taps: its check runs a probe forward
        with (
            stepwise(self._mixer_sites(), states) if states is not None else contextlib.nullcontext(),
            layer_taps.tapping(self.model, capture.layers) if capture.layers else contextlib.nullcontext() as taps,
        ):
            if parts is not None:
                inner, head = parts
                hidden = inner(ids, cache=cache)
                logits = head(hidden)
            else:
                hidden, logits = None, self.model(ids, cache=cache)
        tapped = taps.joined() if taps is not None else None
        if not batched:
            logits, hidden = logits[0], hidden[0] if hidden is not None else None
            tapped = tapped[0] if tapped is not None else None
        return ForwardResult(
            logits=logits.astype(mx.float32), hidden=hidden, states=capture.states, layer_hidden=tapped
        )

    def prefill(self, token_ids: list[int], cache: list, capture: Capture | None = None) -> mx.array | None:
        """Feed a prompt in chunks, evaluating as it goes to bound memory.

        Returns:
            [n, hidden] final hidden states of every fed position when
            `capture.hidden` (None when nothing was fed), else None.
        """
        hidden: list[mx.array] = []
        for _ in self.prefill_steps(token_ids, cache, capture, hidden):
            pass
        return joined_rows(hidden)

    def prefill_steps(
        self,
        token_ids: list[int],
        cache: list,
        capture: Capture | None = None,
        hidden: list | None = None,
        layer_hidden: list | None = None,
    ) -> Iterator[int]:
        """`prefill`, yielding the count of prompt tokens in the cache after each chunk (progress);
        with `capture.hidden` each chunk's final hidden states are appended to `hidden`, with
        `capture.layers` its tapped rows ([n, len(layers) * hidden]) to `layer_hidden`.

        Each chunk is evaluated before the next is built: activations stay one
        chunk big, whatever the prompt length.
        """
        for start in range(0, len(token_ids), self.prefill_chunk):
            chunk = mx.array(token_ids[start : start + self.prefill_chunk], dtype=mx.uint32)
            layers = capture.layers if capture is not None else ()
            if capture is not None and capture.kv is not None:
                capture.kv.attach(self.model, cache, False)
            parts = self.hidden_parts() if capture is not None and capture.hidden else None
            with layer_taps.tapping(self.model, layers) if layers else contextlib.nullcontext() as taps:
                if parts is not None:
                    inner, _ = parts
                    rows = inner(chunk[None], cache=cache)[0]  # no LM head: the prefill's logits are unused
                    mx.eval([c.state for c in cache], rows)
                    if hidden is not None:
                        hidden.append(rows)
                else:
                    self.model(chunk[None], cache=cache)
                    mx.eval([c.state for c in cache])
            tapped = taps.joined() if taps is not None else None
            if tapped is not None and layer_hidden is not None:
                layer_hidden.append(tapped[0])
                mx.eval(tapped)
            yield min(start + self.prefill_chunk, len(token_ids))

    def hidden_parts(self):
        """(inner model, LM head): what a hidden-state capture calls, checked once.

        Raises:
            SpecpipeError when head(inner(x)) is not the model's own logits,
            or the model is not llama-like (introspect.llama_parts).
        """
        if self._parts is None:
            inner, head = introspect.llama_parts(self.model, "mtp")
            # A model whose forward does more than this (logit soft-capping, a logit scale) would
            # verify with other logits than draft=none: refuse it rather than lose exactness.
            probe = mx.array([[0, 1]], dtype=mx.uint32)
            if not mx.allclose(head(inner(probe)), self.model(probe), rtol=1e-5, atol=1e-5).item():
                from specpipe.errors import SpecpipeError

                raise SpecpipeError(
                    f"{self.info.name}: its forward does more than the LM head over the inner model's output, so "
                    "its hidden states cannot be captured exactly; "
                    "use a drafter without an MTP head (draft=model, ngram)"
                )
            self._parts = inner, head
        return self._parts

    def _mixer_sites(self) -> list[tuple[Any, Any, StepwiseMixer]]:
        if self._mixers is None:
            self._mixers = [(parent, key, StepwiseMixer(m)) for parent, key, m in introspect.mixer_sites(self.model)]
        return self._mixers

    def encode_prompt(self, text: str, chat: bool, system: str | None = None) -> list[int]:
        """Token ids for `text`, through the chat template when asked and available."""
        if chat and getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "system", "content": system}] if system else []
            messages.append({"role": "user", "content": text})
            return self.encode_messages(messages)
        return list(self.tokenizer.encode(text))

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """A multi-turn conversation through the chat template, ready for the assistant's turn."""
        if not getattr(self.tokenizer, "chat_template", None):
            text = "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"
            return list(self.tokenizer.encode(text))
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    @property
    def vocab_size(self) -> int | None:
        """Rows of logits a forward returns (the embedding's row count; may exceed the tokenizer's)."""
        return _model_arg(self.model, "vocab_size")

    @property
    def context_length(self) -> int | None:
        """Positions the model was trained for (None: no fixed limit, e.g. recurrent models)."""
        return _model_arg(self.model, "max_position_embeddings")

    def check_prompt_fits(self, n_prompt: int) -> None:
        """Refuse a prompt that leaves no room in the model's context (SpecpipeError)."""
        limit = self.context_length
        if limit and n_prompt >= limit:
            from specpipe.errors import SpecpipeError

            raise SpecpipeError(
                f"the prompt is {n_prompt} tokens but {self.info.name}'s context is {limit} tokens: "
                "shorten the prompt, or use a model with a longer context"
            )


def joined_rows(chunks: list) -> mx.array | None:
    """Per-chunk [n_i, hidden] rows (prefill_steps' `hidden`) as one [sum n_i, hidden] array; None if empty."""
    if not chunks:
        return None
    return mx.concatenate(chunks) if len(chunks) != 1 else chunks[0]


def _model_arg(model, name: str) -> int | None:
    """An mlx-lm ModelArgs field, also from a nested text_config (multimodal configs)."""
    args = getattr(model, "args", None)
    value = getattr(args, name, None)
    if value is None:
        text = getattr(args, "text_config", None) or {}
        value = text.get(name) if isinstance(text, dict) else getattr(text, name, None)
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def same_vocabulary(a: Engine, b: Engine) -> str | None:
    """Compare two tokenizers token by token.

    Returns:
        None when both score the same number of tokens and every token string
        maps to the same id in both, else a short description of the first
        difference (for the error message).
    """
    if a.vocab_size and b.vocab_size and a.vocab_size != b.vocab_size:
        # same tokenizer, different logit widths: sampling cannot compare p and q, greedy emits ids one side lacks
        return f"{a.vocab_size} vs {b.vocab_size} token scores per position"
    va, vb = a.tokenizer.get_vocab(), b.tokenizer.get_vocab()
    if va == vb:
        return None
    if len(va) != len(vb):
        return f"{len(va)} vs {len(vb)} tokens"
    for token, idx in va.items():
        if vb.get(token) != idx:
            return f"token {token!r} is id {idx} in one and {vb.get(token)} in the other"
    return "vocabularies differ"
