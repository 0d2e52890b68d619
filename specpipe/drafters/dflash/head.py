"""The DFlash block head in MLX: one forward drafts a whole block of positions from the target's taps.

Contract: `DFlashHead.block(block_ids, context_rows, cache, embed)` fuses the new context positions'
taps (`fc` then `hidden_norm`), appends their keys / values to every draft layer's cache (context
only: the block's own keys are never stored), runs the block ([last token, mask, mask, ...]) through
the draft layers with non-causal attention inside the block, and returns the final-normed hidden
states of the block. It never runs the target; the drafter applies the target's LM head.

Mirrors z-lab's `dflash/model_mlx.py` (`DFlashAttention`, `DFlashDecoderLayer`, `DFlashDraftModel`,
dflash 0.1.0 on PyPI) for full-attention layers; tests/test_dflash_parity.py compares the logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    num_taps: int  # target layers fused by `fc` (len(target_layer_ids))
    block_size: int  # positions per block: the last token plus block_size - 1 masks
    mask_token_id: int
    is_causal: bool = False  # the published heads attend both ways inside the block
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None


class Attention(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        dim, hd = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.is_causal = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.is_causal
        self.scale = hd**-0.5
        self.q_proj = nn.Linear(dim, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, dim, bias=False)
        self.q_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)

    def _kv(self, x: mx.array) -> tuple[mx.array, mx.array]:
        B, L, _ = x.shape
        keys = self.k_norm(self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        return keys, self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)

    def __call__(self, x: mx.array, ctx: mx.array, rope: Any, cache: KVCache) -> mx.array:
        B, L, _ = x.shape
        S = ctx.shape[1]  # new context positions; they sit at cache.offset .., the block right after them
        queries = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, -1)).transpose(0, 2, 1, 3)
        ctx_keys, ctx_values = self._kv(ctx)
        block_keys, block_values = self._kv(x)
        queries = rope(queries, offset=cache.offset + S)
        ctx_keys = rope(ctx_keys, offset=cache.offset)
        block_keys = rope(block_keys, offset=cache.offset + S)
        keys, values = cache.update_and_fetch(ctx_keys, ctx_values)  # the context's keys stay for later blocks
        ctx_len = keys.shape[2]
        keys = mx.concatenate([keys, block_keys], axis=2)
        values = mx.concatenate([values, block_values], axis=2)
        mask = create_causal_mask(L, offset=ctx_len) if self.is_causal else None
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, ctx: mx.array, rope: Any, cache: KVCache) -> mx.array:
        # the context rows enter every layer as they are (fused once), as the reference does
        h = x + self.self_attn(self.input_layernorm(x), ctx, rope, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashHead(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.num_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.rope = initialize_rope(
            cfg.head_dim,
            base=cfg.rope_theta,
            traditional=False,
            scaling_config=cfg.rope_scaling,
            max_position_embeddings=cfg.max_position_embeddings,
        )

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def block(self, block_ids: mx.array, context_rows: mx.array, cache: list[KVCache], embed: nn.Module) -> mx.array:
        """One block forward.

        Args:
            block_ids: [L] uint32: the last context token, then L - 1 mask ids.
            context_rows: [S, num_taps * H]: the taps of the S context positions the cache lacks
                (positions cache.offset .. cache.offset + S - 1; the block starts right after).
            cache: one KVCache per draft layer, holding the context positions before these.
            embed: the target's embedding (the head ships none).

        Returns:
            [L, H] final-normed hidden states of the block (row 0 is the last token's, never a draft).
        """
        h = embed(block_ids[None]) * self.cfg.input_embedding_scale
        ctx = self.hidden_norm(self.fc(context_rows[None].astype(h.dtype)))
        for layer, c in zip(self.layers, cache):
            h = layer(h, ctx, self.rope, c)
        return self.norm(h)[0]

    def logits(self, hidden: mx.array, lm_head: Any) -> mx.array:
        """[L, vocab] float32 from the target's LM head, with the checkpoint's scale and soft cap."""
        logits = lm_head(hidden).astype(mx.float32) * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        return mx.tanh(logits / cap) * cap if cap else logits
