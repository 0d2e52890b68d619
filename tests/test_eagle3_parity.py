"""Parity: specpipe's EAGLE-3 head against the reference implementations, on the same tiny random
weights and the same inputs (the taps of a tiny random llama target), on torch's CPU build.

References (tests/reference/, each file names its source commit and licence):
- eagle_cnets.py: SafeAILab/EAGLE `eagle/model/cnets.py` (`Model`), for the EAGLE layout as
  yuhuili, AngelSlim and SpecForge export it (safetensors and torch.save'd pytorch_model.bin);
- speculators_eagle3.py: speculators' first layer on transformers' Llama / Qwen3 decoder layers and
  core.py's forward, for the speculators layout (every norm switch, two decoder layers, qwen3).

Run: pip install -e ".[test,parity]" && python -m pytest -q -m parity
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from eagle3_tiny import head_config, random_weights, write

from specpipe.drafters.eagle3.layouts import load_head
from specpipe.engine.engine import Capture
from specpipe.engine.layer_taps import default_layers
from specpipe.engine.load.loader import load_engine

pytestmark = pytest.mark.parity
sys.path.insert(0, str(Path(__file__).parent / "reference"))
torch: Any = None  # imported by the fixture below: collecting this file (as the default run does) loads no torch

# float32 on both sides; the logits are O(1-10), so 1e-4 is ~1e-5 relative: a misplaced norm, a wrong
# rotary position, a swapped concat or an off-by-one pair moves them by O(1)
TOL = 1e-4
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10]
K = 4  # chained draft steps compared
MAX_DIFF: dict[str, float] = {}  # layout -> max |specpipe - reference| over every compared logit


@pytest.fixture(scope="module", autouse=True)
def _torch():
    global torch
    torch = pytest.importorskip("torch", reason="the parity tests need torch: pip install -e '.[test,parity]'")
    torch.set_grad_enabled(False)
    yield
    torch.set_grad_enabled(True)


@pytest.fixture(scope="module")
def target():
    return load_engine("tiny-random", precision="float32", arch="llama", seed=0, tiny={"num_hidden_layers": 8})


@pytest.fixture(scope="module")
def taps(target):
    """[n, 3H] the target's hidden states entering layers 2, 4 and 5 (EAGLE's 2, N//2, N-3 for N = 8)."""
    result = target.forward(PROMPT, target.make_cache(), capture=Capture(layers=default_layers(8)))
    return np.array(result.layer_hidden)


def record(name: str, *pairs) -> float:
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs)
    MAX_DIFF[name] = diff
    print(f"\n[parity] {name}: max abs diff {diff:.2e} (tolerance {TOL:.0e})")
    return diff


def specpipe_chain(head, ids, fused, k):
    """Prefill the head over all pairs, then k greedy chained steps: ([n, V] logits, [k, V] chained logits, tokens)."""
    cache = head.make_cache()
    logits, out = head.step(mx.array(ids, dtype=mx.uint32), mx.array(fused), cache)
    rows, tokens, h, last = [], [], out[-1:], logits[-1]
    for _ in range(k):
        token = head.target_ids(mx.argmax(last)[None])
        tokens.append(int(token.item()))
        step, out = head.step(token.astype(mx.uint32), h, cache)
        rows.append(step[0])
        last, h = step[0], out
    return np.array(logits), np.array(mx.stack(rows)), tokens


# ---------------------------------------------------------------- the EAGLE layout (SafeAILab/EAGLE cnets.py)


def eagle_reference(cfg, weights):
    import eagle_cnets

    config = types.SimpleNamespace(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        rope_scaling=None,
        rms_norm_eps=cfg.rms_norm_eps,
        hidden_act="silu",
        pretraining_tp=1,
        pad_token_id=None,
        vocab_size=cfg.vocab_size,
        draft_vocab_size=cfg.draft_vocab_size,
    )
    model = eagle_cnets.Model(config).eval()
    state = {k.replace("layers.0.", "midlayer.", 1): torch.from_numpy(np.asarray(v)) for k, v in weights.items()}
    model.load_state_dict(state, strict=True)
    return model


def eagle_reference_chain(model, ids, fused, k):
    """cnets' own drafting loop for one branch (topK_genrate with top_k = 1): prefill, then k chained steps."""
    n = len(ids)
    out_hidden, kv = model(torch.from_numpy(fused)[None], input_ids=torch.tensor([ids]), use_cache=True)
    logits = model.lm_head(model.norm(out_hidden))[0]
    rows, tokens, h, last = [], [], out_hidden[:, -1:], logits[-1]
    for step in range(k):
        draft = int(torch.argmax(last))
        token = draft + int(model.d2t[draft])  # topK_genrate: topk_index + self.d2t[topk_index]
        tokens.append(token)
        out_hidden, kv = model(
            h,
            input_ids=torch.tensor([[token]]),
            past_key_values=kv,
            position_ids=torch.tensor([n + step]),
            use_cache=True,
        )
        last = model.lm_head(model.norm(out_hidden))[0, -1]
        rows.append(last)
        h = out_hidden
    return logits.numpy(), torch.stack(rows).numpy(), tokens


@pytest.mark.parametrize("layout", ["eagle", "eagle-bin", "angelslim", "specforge"])
def test_eagle_layouts_match_eagles_own_model(tmp_path, taps, layout):
    cfg = head_config()
    weights = random_weights(cfg, seed=7)
    folder = write(tmp_path / layout, layout.removesuffix("-bin"), cfg, weights)
    if layout == "eagle-bin":  # yuhuili's EAGLE3-LLaMA3.1-Instruct-8B ships a torch.save'd pytorch_model.bin
        (folder / "model.safetensors").unlink()
        state = {k.replace("layers.0.", "midlayer.", 1): torch.from_numpy(np.asarray(v)) for k, v in weights.items()}
        torch.save(state, folder / "pytorch_model.bin")
    head, source = load_head(folder)
    assert source.layout == "eagle"
    ids, fused = PROMPT[1:], taps[:-1]  # pair i: the target's state after token i, and token i + 1
    reference = eagle_reference(cfg, weights)
    ours = specpipe_chain(head, ids, np.array(head.fuse(mx.array(fused))), K)
    theirs = eagle_reference_chain(reference, ids, fused, K)
    assert ours[2] == theirs[2], "the drafted tokens differ"
    assert record(layout, (ours[0], theirs[0]), (ours[1], theirs[1])) < TOL


# ---------------------------------------------------------------- the speculators layout


def speculators_reference(cfg, weights):
    import speculators_eagle3
    from transformers import LlamaConfig, Qwen3Config

    kind = Qwen3Config if cfg.qk_norm else LlamaConfig
    layer = kind(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        num_hidden_layers=cfg.num_layers,
        vocab_size=cfg.vocab_size,
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
    )
    model = speculators_eagle3.Eagle3Reference(
        layer,
        cfg.draft_vocab_size,
        norm_before_residual=cfg.norm_before_residual,
        norm_before_fc=cfg.norm_before_fc,
        fc_norm=cfg.fc_norm,
        norm_output=cfg.norm_output,
    ).eval()
    state = {k: torch.from_numpy(np.asarray(v)) for k, v in weights.items() if k not in ("d2t", "t2d")}
    model.load_state_dict(state, strict=True)
    return model


def specpipe_ttt(head, ids, fused, steps):
    """core.py's test-time-training steps, as chains: step j at pair i reads the step j-1 output at i and the
    teacher-forced id ids[i + j] (0 past the end), after the head has seen pairs 0..i."""
    n = len(ids)
    per_step = [np.zeros((n, head.cfg.draft_vocab_size), np.float32) for _ in range(steps)]
    for i in range(n):
        cache = head.make_cache()
        logits, out = head.step(mx.array(ids[: i + 1], dtype=mx.uint32), mx.array(fused[: i + 1]), cache)
        per_step[0][i] = np.array(logits[-1])
        h = out[-1:]
        for j in range(1, steps):
            token = ids[i + j] if i + j < n else 0
            logits, h = head.step(mx.array([token], dtype=mx.uint32), h, cache)
            per_step[j][i] = np.array(logits[0])
    return per_step


VARIANTS = {
    "speculators": {},
    "speculators-3.1": dict(num_layers=2, norm_before_residual=True, norm_output=True, fc_norm=True),
    "speculators-qwen3": dict(qk_norm=True, norm_before_fc=True),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_speculators_layout_matches_speculators_model(tmp_path, taps, variant):
    cfg = head_config(**VARIANTS[variant])
    weights = random_weights(cfg, seed=11)
    head, source = load_head(write(tmp_path / variant, "speculators", cfg, weights, taps=list(default_layers(8))))
    assert source.layout == "speculators" and source.taps == default_layers(8)
    ids, fused = PROMPT[1:], taps[:-1]
    fused_ours = np.array(head.fuse(mx.array(fused)))
    reference = speculators_reference(cfg, weights)
    theirs = reference(torch.from_numpy(fused)[None], torch.tensor([ids]), ttt_steps=3)
    ours = specpipe_ttt(head, ids, fused_ours, 3)
    assert record(variant, *((o, t.numpy()) for o, t in zip(ours, theirs))) < TOL
    # and the reduced vocabulary: speculators' d2t is the same offset map (train/vocab_mapping.py)
    _, _, tokens = specpipe_chain(head, ids, fused_ours, 2)
    kept = set(np.flatnonzero(weights["t2d"]).tolist())
    assert all(t in kept for t in tokens)


def test_zz_report():
    """Print every layout's figure in one place (runs last in the file)."""
    if MAX_DIFF:
        print("\n[parity] " + ", ".join(f"{k} {v:.1e}" for k, v in MAX_DIFF.items()))
