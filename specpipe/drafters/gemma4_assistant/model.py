"""The Gemma-4 assistant (the MTP drafter Google publishes beside each Gemma-4 size) as an MLX module.

Contract: `step(embedded, hidden, kv, position)` runs one drafter forward for one query: the target's
scaled embedding of a token and a hidden state ([1, 1, backbone] each, in that order) are projected to
the drafter's width, go through decoder layers whose attention reads only the target's K/V (`kv`, per
attention kind: the drafter has no K/V of its own and no cache), and come back as the next hidden state
(post_projection, [1, 1, backbone]) and logits ([1, vocab] float32). The layers are mlx-lm's gemma4_text
DecoderLayer built with every layer KV-shared; mlx-vlm 0.7.10's Gemma4AssistantDraftModel is the
reference (speculative/drafters/gemma4_assistant/). It never touches the target's modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gemma4_text import DecoderLayer, ModelArgs

from specpipe.engine.target_kv import KvRows


@dataclass(frozen=True)
class AssistantConfig:
    """config.json's top level (mlx-vlm's Gemma4AssistantConfig; its defaults where a key is absent)."""

    text: ModelArgs  # text_config, every layer KV-shared (the assistant has no k_proj / v_proj)
    backbone_hidden_size: int  # the target's hidden size: the width of its embeddings and hidden states
    use_ordered_embeddings: bool = False  # E2B / E4B: the centroid-routed LM head (MaskedEmbedder)
    num_centroids: int = 2048
    centroid_intermediate_top_k: int = 32
    tie_word_embeddings: bool = True


class _Inner(nn.Module):
    def __init__(self, text: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(text.vocab_size, text.hidden_size)  # the LM head's rows (tied)
        self.layers = [DecoderLayer(text, layer_idx=i) for i in range(text.num_hidden_layers)]
        self.norm = nn.RMSNorm(text.hidden_size, eps=text.rms_norm_eps)


class CentroidHead(nn.Module):
    """The E2B / E4B sparse LM head: score `num_centroids` token clusters, then only the top-k clusters'
    tokens densely; every other id gets min(scored) - 1, as mlx-vlm's MaskedEmbedder (HF's
    Gemma4AssistantMaskedEmbedder) does, so it never wins an argmax and keeps a little mass under sampling."""

    def __init__(self, cfg: AssistantConfig):
        super().__init__()
        self.top_k = cfg.centroid_intermediate_top_k
        self.num_centroids = cfg.num_centroids
        self.centroids = nn.Linear(cfg.text.hidden_size, cfg.num_centroids, bias=False)
        self.token_ordering = mx.zeros((cfg.text.vocab_size,), dtype=mx.int32)  # cluster c's ids, block by block
        self.freeze(keys=["token_ordering"], recurse=False)  # a buffer, not a weight

    def __call__(self, h: mx.array, rows: mx.array) -> mx.array:
        """h: [1, 1, hidden]; rows: [vocab, hidden] (the tied embedding) -> [1, vocab] logits."""
        scores = self.centroids(h)[0, 0]  # [num_centroids]
        top = mx.argpartition(scores, kth=-self.top_k)[-self.top_k :]
        ids = self.token_ordering.reshape(self.num_centroids, -1)[top].reshape(-1)  # [top_k * per_cluster]
        picked = rows[ids] @ h[0, 0]  # [top_k * per_cluster]
        out = mx.full((rows.shape[0],), picked.min() - 1.0, dtype=picked.dtype)
        out[ids] = picked
        return out[None]


class Gemma4Assistant(nn.Module):
    def __init__(self, cfg: AssistantConfig):
        super().__init__()
        self.cfg = cfg
        text = cfg.text
        self.model = _Inner(text)
        self.pre_projection = nn.Linear(2 * cfg.backbone_hidden_size, text.hidden_size, bias=False)
        self.post_projection = nn.Linear(text.hidden_size, cfg.backbone_hidden_size, bias=False)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        if cfg.use_ordered_embeddings:
            self.masked_embedding = CentroidHead(cfg)

    def step(self, embedded: mx.array, hidden: mx.array, kv: dict[str, KvRows], position: int):
        """One draft position.

        Args:
            embedded: [1, 1, backbone] the target's embedding of the token, times its embed scale.
            hidden: [1, 1, backbone] the target's final (normed) hidden state, or the previous step's output.
            kv: per attention kind, the target's K/V over the accepted prefix (engine/target_kv.py).
            position: the query's RoPE position; mlx-vlm holds it at the last cached position for every step.

        Returns:
            (next hidden [1, 1, backbone], logits [1, vocab] float32)
        """
        h = self.pre_projection(mx.concatenate([embedded, hidden], axis=-1))
        for layer in self.model.layers:
            rows = kv[layer.layer_type]
            # the target's window layers come cut to their last `window` positions, all inside the query's
            # window (position = the last of them), so no mask: every key is one the query may read
            h, _, _ = layer(h, None, None, per_layer_input=None, shared_kv=(rows.keys, rows.values), offset=position)
        h = self.model.norm(h)
        return self.post_projection(h), self._logits(h).astype(mx.float32)

    def _logits(self, h: mx.array) -> mx.array:
        if self.cfg.use_ordered_embeddings:
            return self.masked_embedding(h, self.model.embed_tokens.weight)
        if self.cfg.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(h)[0]
        return self.lm_head(h)[0]
