"""`draft=layerskip`: self-speculative decoding. The target drafts with its
first N layers (or `draft.layers`), then its own final norm and LM head.

Contract: no extra weights; the drafter runs a `LayerSkipModel` (a view
sharing the target's arrays) through its own Engine and its own small cache
(one KV cache per kept layer), so drafting never touches the target cache.
The cache is a plain list of mlx-lm KV caches: the rollback stage trims it,
exactly as for `draft=model`. Works on mlx-lm llama-like models (llama,
qwen2, qwen3, mistral, ...); anything else is refused with a SpecpipeError.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import msgspec
from mlx_lm.models.base import create_attention_mask

from specpipe.costmodel.weights import weight_bytes
from specpipe.drafters.model import ModelDrafter
from specpipe.engine import introspect
from specpipe.engine.engine import Engine
from specpipe.engine.introspect import LLAMA_LIKE as WORKS_ON
from specpipe.errors import SpecpipeError


class LayerSkipModel(nn.Module):
    """The target's embedding, a subset of its layers, its norm and LM head.

    Callable like an mlx-lm model (`model(ids[None], cache=cache)` -> logits)
    and with `.layers`, so `make_prompt_cache` gives one cache per kept layer.
    """

    def __init__(self, target_model: nn.Module, layer_ids: list[int]):
        super().__init__()
        self.embed_tokens, self.layers, self.norm, self._head = introspect.layer_view(
            target_model, layer_ids, "layerskip"
        )
        for i, layer in zip(layer_ids, self.layers):
            # Sliding-window and recurrent layers need caches/masks this view does not build.
            if not introspect.is_full_attention(layer):
                raise SpecpipeError(
                    f"draft=layerskip: layer {i} of this model is not a full-attention block "
                    f"({type(layer).__name__}); it works on {WORKS_ON}"
                )

    def __call__(self, inputs: mx.array, cache=None, input_embeddings=None) -> mx.array:
        h = self.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        cache = cache if cache is not None else [None] * len(self.layers)
        mask = create_attention_mask(h, cache[0])
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, cache=c)
        return self._head(self.norm(h))


def pick_layers(n_total: int, depth: int | None, layers: list[int] | None) -> list[int]:
    """Layer indices to draft with: `layers` verbatim, else the first `depth`.

    Example: n_total=30, depth=8 -> [0..7]; layers=[0, 1, 2, 29] -> as given.
    """
    if layers:
        bad = [i for i in layers if not 0 <= i < n_total]
        if bad:
            raise SpecpipeError(
                f"draft.layers={list(layers)}: {bad} out of range for a {n_total}-layer target (0..{n_total - 1})"
            )
        return list(layers)
    if depth is None or not 1 <= depth < n_total:
        raise SpecpipeError(f"draft.depth={depth}: need 1 <= depth < {n_total} (the target's layer count)")
    return list(range(depth))


class LayerSkipDrafter(ModelDrafter):
    """A ModelDrafter whose model is a layer subset of the target (same propose/prefill)."""

    name = "layerskip"

    def __init__(
        self, target, depth: int | None = 8, layers: list[int] | None = None, sampler=None, p_min: float = 0.0
    ):
        """
        Args:
            target: the target Engine (weights shared, never copied).
            depth: draft with layers [0, depth).
            layers: explicit layer indices (wins over depth), e.g. [0, 1, 2, 3, 27].
            sampler: specpipe.core.sampling.Sampler; None or temperature 0 drafts greedily.
            p_min: budget=confidence's floor (see ModelDrafter).
        """
        self.layer_ids = pick_layers(len(introspect.decoder_layers(target.model, "layerskip")), depth, layers)
        model = LayerSkipModel(target.model, self.layer_ids)
        label = (
            f"{self.layer_ids[0]}-{self.layer_ids[-1]}"
            if self.layer_ids == list(range(self.layer_ids[0], self.layer_ids[-1] + 1))
            else ",".join(map(str, self.layer_ids))
        )
        info = msgspec.structs.replace(target.info, name=f"{target.info.name}[layers {label}]", source="layerskip")
        # Everything else (cache, propose, sampling) is ModelDrafter's, on this view.
        engine = Engine(model, target.tokenizer, info)
        inner, _ = introspect.llama_parts(target.model, "layerskip")
        self.cost_per_token = weight_bytes(
            *model.layers, model.norm, introspect.lm_head_weights(target.model, inner)
        ) / weight_bytes(target.model)
        super().__init__(target=target, load=lambda **_: engine, model="layerskip", sampler=sampler, p_min=p_min)
