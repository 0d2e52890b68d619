"""EAGLE-3's training-time test: the head's chained steps over whole sequences, attending as drafting does.

Contract: `ttt_steps(head, tokens, taps, steps)` yields, for s = 1..steps, step s's (logits, out) over
every position a chain can reach at that depth: step s at position i is the head's s-th chained step
after a context ending at token i - s + 1, fed the true tokens (a correct draft is the true token).
Its attention reads what the head's KV cache holds at that moment when drafting: step 1's keys for the
context's positions 1 .. i-s+1, then one key per chained step k = 2..s at position i-s+k. A causal pass
over step s's own outputs (the simplification this replaces) let step 2 attend to step-2 keys at every
earlier position, which drafting never sees: the first head trained that way agreed with the target on
21 % of held-out second steps and ~1 % when drafting (docs/benchmarks/log/2026-12-06-drafters-sittings.md).

Worked indices (T tokens t_0..t_{T-1}, taps r_0..r_{T-1}): step 1 pairs (r_{i-1}, t_i) for i = 1..T-1;
step s pairs (h_{s-1, i-1}, t_i) for i = s..T-1, row a = i - s. Its keys: step 1's rows 0..a (causal,
as step 1's own mask), and step k's row a for each k = 2..s (a diagonal), which is the key step k made
at position i - s + k. RoPE positions are i - 1, as the head cache's offsets give them when drafting.

EAGLE-3 (SafeAILab/EAGLE `eagle/traineagle3/cnets.py`, `cache_hidden`) trains the same way; this file
computes it for the head of drafters/eagle3/head.py, checked against drafting by tests/test_eagle3_ttt.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx

from specpipe.drafters.eagle3.head import Attention, Eagle3Head, FirstLayer


def _qkv(attn: Attention, x: mx.array, offset: int) -> tuple[mx.array, mx.array, mx.array]:
    """q, k, v [B, heads, n, d] (kv heads repeated to the query heads) at RoPE positions offset.."""
    q, k, v = attn.qkv(x, offset)
    if attn.n_kv != attn.n_heads:  # grouped queries: each kv head serves n_heads / n_kv query heads
        k, v = mx.repeat(k, attn.n_heads // attn.n_kv, axis=1), mx.repeat(v, attn.n_heads // attn.n_kv, axis=1)
    return q, k, v


def _attend(attn: Attention, x: mx.array, step: int, kept: list[tuple[mx.array, mx.array]]) -> mx.array:
    """Step `step`'s attention over x ([B, n, in]); `kept` holds steps 1..step-1's (k, v) and gets this one's."""
    q, k, v = _qkv(attn, x, offset=step - 1)
    kept.append((k, v))
    n = q.shape[2]
    k1, v1 = kept[0][0][:, :, :n], kept[0][1][:, :, :n]
    q = q * attn.scale
    causal = q @ k1.transpose(0, 1, 3, 2)  # [B, heads, n, n]: step 1's keys at rows 0..a
    rows = mx.arange(n)
    causal = mx.where(rows[None, :] <= rows[:, None], causal, -mx.inf)
    diagonal = [(q * kk[:, :, :n]).sum(axis=-1, keepdims=True) for kk, _ in kept[1:]]  # [B, heads, n, 1] each
    weights = mx.softmax(mx.concatenate([causal, *diagonal], axis=-1), axis=-1, precise=True)
    out = weights[..., :n] @ v1
    for j, (_, vv) in enumerate(kept[1:]):
        out = out + weights[..., n + j : n + j + 1] * vv[:, :, :n]
    b = x.shape[0]
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


def _layer(layer, x: mx.array | tuple[mx.array, mx.array], step: int, kept: list) -> mx.array:
    """One decoder layer of the head (FirstLayer takes (embeds, hidden)) at chained step `step`."""
    if isinstance(layer, FirstLayer):
        embeds, hidden = x
        residual = hidden
        hidden = layer.hidden_norm(hidden)
        if layer.norm_before_residual:
            residual = hidden
        fed = mx.concatenate([layer.input_layernorm(embeds), hidden], axis=-1)
        h = residual + _attend(layer.self_attn, fed, step, kept)
    else:
        h = x + _attend(layer.self_attn, layer.input_layernorm(x), step, kept)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def ttt_steps(head: Eagle3Head, tokens: mx.array, taps: mx.array, steps: int) -> Iterator[tuple[mx.array, mx.array]]:
    """Steps 1..`steps` over [B, T] tokens and their [B, T, num_taps * H] taps (module docstring).

    Yields (logits [B, T - s, draft_vocab], out [B, T - s, H]) for step s: row a is position i = s + a,
    scored against the target's next token after t_i (labels[:, s:]).
    """
    kept: list[list] = [[] for _ in head.layers]  # per layer, per step: (k, v)
    hidden = head.fuse(taps[:, :-1])
    for s in range(1, steps + 1):
        if s > 1:
            hidden = hidden[:, :-1]  # position i reads the previous step's output at i - 1
        embeds = head.embed(tokens[:, s:])
        h = _layer(head.layers[0], (embeds, hidden.astype(embeds.dtype)), s, kept[0])
        for layer, own in zip(head.layers[1:], kept[1:]):
            h = _layer(layer, h, s, own)
        if head.cfg.norm_output:
            h = head.norm(h)
            logits = head.lm_head(h)
        else:
            logits = head.lm_head(head.norm(h) if head.cfg.logits_norm else h)
        hidden = h
        yield logits, h
