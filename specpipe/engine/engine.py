"""The MLX engine: one loaded model, its tokenizer, its caches, its forwards.

Contract: stages hand it token ids and a cache and get float32 logits back,
one row per input position. It knows nothing of drafting, verification or
GGUF files; loaders (engine/loader.py) build it, stages only call it.
"""

from __future__ import annotations

from typing import Iterator

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from specpipe.events import ModelInfo

PREFILL_CHUNK = 512  # prompt positions per prefill forward; prefill.chunk sets an engine's own


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
        self.prefill_chunk = PREFILL_CHUNK
        self.kv = None  # a KV cache policy (engine/kv.py, kv=...); None: the model's own caches

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self.tokenizer.eos_token_ids or ())

    def make_cache(self) -> list:
        """A fresh per-layer cache (KV for attention, state for recurrent layers), as `kv` chooses."""
        return self.kv.make_cache(self.model) if self.kv is not None else make_prompt_cache(self.model)

    def forward(self, token_ids: mx.array, cache: list) -> mx.array:
        """Run the model over `token_ids` appended to `cache`.

        Args:
            token_ids: [n] int array (or list) of new positions.
            cache: the cache from `make_cache`, updated in place.

        Returns:
            [n, vocab] float32 logits (lazy: nothing is evaluated here).
        """
        if not isinstance(token_ids, mx.array):
            token_ids = mx.array(token_ids, dtype=mx.uint32)
        logits = self.model(token_ids[None], cache=cache)
        return logits[0].astype(mx.float32)

    def prefill(self, token_ids: list[int], cache: list) -> None:
        """Feed a prompt in chunks, evaluating as it goes to bound memory."""
        for _ in self.prefill_steps(token_ids, cache):
            pass

    def prefill_steps(self, token_ids: list[int], cache: list) -> Iterator[int]:
        """`prefill`, yielding the count of prompt tokens in the cache after each chunk (progress).

        Each chunk is evaluated before the next is built: activations stay one
        chunk big, whatever the prompt length.
        """
        for start in range(0, len(token_ids), self.prefill_chunk):
            chunk = mx.array(token_ids[start : start + self.prefill_chunk], dtype=mx.uint32)
            self.model(chunk[None], cache=cache)
            mx.eval([c.state for c in cache])
            yield min(start + self.prefill_chunk, len(token_ids))

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
