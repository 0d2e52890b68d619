"""The EAGLE-3 draft head as an MLX module.

Contract: `Eagle3Head.fuse(taps)` maps the target's low / mid / high hidden states
([n, 3 * Ht], engine/layer_taps.py) to the head's width ([n, H]); `step(ids, hidden,
cache)` runs the head's decoder layers over (embedding of ids[i], hidden[i]) pairs and
returns the draft-vocabulary logits and the hidden states to chain on; `target_ids` /
`target_logits` map draft ids to target ids (`d2t`), with every target id outside the
draft vocabulary at -inf. It reads no files (layouts.py does) and keeps no state but
the KV cache it is handed (`make_cache`).

The computation is the reference implementations', checked on tiny random weights by
tests/test_eagle3_parity.py: SafeAILab/EAGLE `eagle/model/cnets.py` (`Model.forward`,
`LlamaDecoderLayeremb`, `topK_genrate`: logits = lm_head(norm(h)), the pre-norm h fed
back), speculators `models/eagle3/core.py` + `model_definitions.py` (the norm flags,
extra decoder layers, qwen3 q/k norms), SpecForge `modeling/draft/llama3_eagle.py`.

First layer, for one pair (e = embed(token), g = fused or chained hidden):
    residual = g                      (norm_before_residual: hidden_norm(g))
    x = [input_layernorm(e) ; hidden_norm(g)]          # [2H]: q/k/v read 2H
    h = residual + o_proj(attention(x))
    h = h + mlp(post_attention_layernorm(h))
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope


@dataclass(frozen=True)
class HeadConfig:
    """The shapes and switches of one head (layouts.py fills it from a checkpoint's config).

    vocab_size is the target's (the embedding's rows, t2d's length); draft_vocab_size the
    LM head's rows. norm_output is speculators' Eagle 3.1 switch (the normed hidden is scored
    and fed back); logits_norm False is SpecForge's `norm_output: false` (lm_head(h), no norm).
    """

    hidden_size: int
    target_hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    num_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # qwen3-type layers: RMSNorm over each head's q and k
    norm_before_residual: bool = False
    fc_norm: bool = False  # an RMSNorm per tap before fc (fc_norm.{i}.weight)
    norm_before_fc: bool = False  # one RMSNorm over the concatenated taps (input_norm.weight)
    norm_output: bool = False
    logits_norm: bool = True
    num_taps: int = 3
    has_embedding: bool = True  # False: the head reads the target's embedding (vLLM's rule)


# ---------------------------------------------------------------- layers


class Attention(nn.Module):
    def __init__(self, cfg: HeadConfig, in_dim: int):
        super().__init__()
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.scale = nh, nkv, hd, hd**-0.5
        self.q_proj = nn.Linear(in_dim, nh * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(in_dim, nkv * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(in_dim, nkv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
            self.k_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.rope = initialize_rope(hd, cfg.rope_theta, False, cfg.rope_scaling, cfg.max_position_embeddings)

    def qkv(self, x: mx.array, offset: int) -> tuple[mx.array, mx.array, mx.array]:
        """q [B, heads, n, d], k / v [B, kv heads, n, d] for the rows of x at RoPE positions offset.."""
        b, n, _ = x.shape
        q = self.q_proj(x).reshape(b, n, self.n_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, n, self.n_kv, self.head_dim)
        v = self.v_proj(x).reshape(b, n, self.n_kv, self.head_dim).transpose(0, 2, 1, 3)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        return self.rope(q, offset=offset), self.rope(k, offset=offset), v

    def __call__(self, x: mx.array, mask, cache: KVCache | None) -> mx.array:
        b, n, _ = x.shape
        # cache None: a whole sequence at once from position 0
        q, k, v = self.qkv(x, cache.offset if cache is not None else 0)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


class Mlp(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj, self.up_proj = nn.Linear(h, i, bias=bias), nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class FirstLayer(nn.Module):
    """EAGLE-3's layer: attention over [norm(embedding) ; norm(hidden)] (module docstring)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        eps = cfg.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=eps)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=eps)
        self.self_attn = Attention(cfg, 2 * cfg.hidden_size)
        self.mlp = Mlp(cfg)
        self.norm_before_residual = cfg.norm_before_residual

    def __call__(self, embeds: mx.array, hidden: mx.array, mask, cache: KVCache | None) -> mx.array:
        residual = hidden
        hidden = self.hidden_norm(hidden)
        if self.norm_before_residual:
            residual = hidden
        x = mx.concatenate([self.input_layernorm(embeds), hidden], axis=-1)
        h = residual + self.self_attn(x, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Layer(nn.Module):
    """A later decoder layer (speculators heads with num_hidden_layers > 1): a plain llama / qwen3 layer."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, cfg.hidden_size)
        self.mlp = Mlp(cfg)

    def __call__(self, x: mx.array, mask, cache: KVCache | None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


# ---------------------------------------------------------------- the head


class Eagle3Head(nn.Module):
    """fc over the taps, the decoder layers, the final norm and the draft-vocabulary LM head.

    Args:
        cfg: shapes and switches.
        embed: the target's embedding (an nn.Embedding-like callable) for a head that ships none.
    """

    def __init__(self, cfg: HeadConfig, embed=None):
        super().__init__()
        self.cfg = cfg
        if cfg.has_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self._embed = embed  # underscore: not a parameter of the head (the target owns it)
        taps_dim = cfg.num_taps * cfg.target_hidden_size
        if cfg.norm_before_fc:
            self.input_norm = nn.RMSNorm(taps_dim, eps=cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = [nn.RMSNorm(cfg.target_hidden_size, eps=cfg.rms_norm_eps) for _ in range(cfg.num_taps)]
        self.fc = nn.Linear(taps_dim, cfg.hidden_size, bias=False)
        self.layers: list[nn.Module] = [FirstLayer(cfg)] + [Layer(cfg) for _ in range(cfg.num_layers - 1)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # draft id d scores target id d + d2t[d] (EAGLE's offsets); None: the vocabularies are one
        self._d2t: mx.array | None = None

    def set_vocab_map(self, d2t: mx.array | None) -> None:
        """Install the draft -> target offsets ([draft_vocab] ints; None: identity)."""
        self._d2t = None if d2t is None else d2t.astype(mx.int32)

    @property
    def d2t(self) -> mx.array | None:
        return self._d2t

    def make_cache(self) -> list[KVCache]:
        """One KV cache per decoder layer (trimmable: exact rollback is `trim`)."""
        return [KVCache() for _ in self.layers]

    def fuse(self, taps: mx.array) -> mx.array:
        """[n, num_taps * Ht] target hidden states -> [n, H] (the fc, after any input norms)."""
        if self.cfg.norm_before_fc:
            taps = self.input_norm(taps)
        if self.cfg.fc_norm:
            chunks = mx.split(taps, self.cfg.num_taps, axis=-1)
            taps = mx.concatenate([norm(c) for norm, c in zip(self.fc_norm, chunks)], axis=-1)
        return self.fc(taps)

    def embed(self, token_ids: mx.array) -> mx.array:
        if self.cfg.has_embedding:
            return self.embed_tokens(token_ids)
        if self._embed is None:
            raise ValueError("this head ships no embedding and was given none: load it with the target's")
        return self._embed(token_ids)

    def step(self, token_ids: mx.array, hidden: mx.array, cache: list[KVCache]) -> tuple[mx.array, mx.array]:
        """Run the head over n (token, hidden) pairs appended to `cache`.

        Args:
            token_ids: [n] target-vocabulary ids (pair i's token).
            hidden: [n, H] fused target hidden states (`fuse`) or the head's own chained output.

        Returns:
            (logits [n, draft_vocab] float32, out [n, H]: what the next chained step reads).
        """
        logits, h = self.forward(token_ids[None], hidden[None], cache)
        return logits[0].astype(mx.float32), h[0]

    def forward(self, token_ids: mx.array, hidden: mx.array, cache: list[KVCache] | None = None):
        """`step` over [B, n] pairs: (logits [B, n, draft_vocab], out [B, n, H]); cache None: each row is a
        whole sequence from position 0, causal (what training runs; specpipe/train/eagle3.py)."""
        e = self.embed(token_ids)
        h = hidden.astype(e.dtype)
        mask = "causal" if token_ids.shape[1] > 1 else None
        caches = cache if cache is not None else [None] * len(self.layers)
        h = self.layers[0](e, h, mask, caches[0])
        for layer, c in zip(self.layers[1:], caches[1:]):
            h = layer(h, mask, c)
        if self.cfg.norm_output:
            h = self.norm(h)
            logits = self.lm_head(h)
        else:
            logits = self.lm_head(self.norm(h) if self.cfg.logits_norm else h)
        return logits, h

    def target_ids(self, draft_ids: mx.array) -> mx.array:
        """Draft-vocabulary ids -> target ids (`d + d2t[d]`)."""
        return draft_ids if self._d2t is None else draft_ids.astype(mx.int32) + self._d2t[draft_ids]

    def target_logits(self, draft_logits: mx.array) -> mx.array:
        """[n, draft_vocab] -> [n, vocab]: each draft row at its target id, -inf at every other id.

        A target id outside the draft vocabulary then has probability 0 under the head, so a
        comparator that reads these rows keeps the target's distribution exact.
        """
        if self._d2t is None:
            return draft_logits
        n = draft_logits.shape[0]
        cols = self.target_ids(mx.arange(self.cfg.draft_vocab_size))
        out = mx.full((n, self.cfg.vocab_size), -mx.inf, dtype=draft_logits.dtype)
        out[:, cols] = draft_logits
        return out
