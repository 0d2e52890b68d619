"""Parity: draft=gemma4_assistant's draft logits and tokens against mlx-vlm 0.7.10's Gemma4AssistantDraftModel
(the reference the issue names) on the same tiny random weights, the same target and the same context.

specpipe's side drafts from its own view after a pipeline run whose drafts were partly rejected (so the
K/V it reads is what the rollbacks left); mlx-vlm's side gets the K/V of one fresh mlx-lm prefill over
the same context, taken from the cache by mlx-vlm's own `_mtp_shared_kv_from_prompt_cache`, and drafts
with its own `draft_block`. Tolerance: max |diff| of the logits < 1e-4 (float32), drafted tokens equal.
Contexts stay inside the 64-position window: past it mlx-vlm's sliding mask leaves out the oldest key
of a full window (masks.py `_local_window_offset`), which specpipe does not copy.

Run: pip install -e ".[test,parity]" && python -m pytest -q -m parity tests/test_gemma4_assistant_parity.py
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import mlx.core as mx
import pytest
from conftest import generate
from gemma4_tiny import config, random_weights, write
from test_gemma4_assistant import tiny_gemma4

from specpipe.drafters.gemma4_assistant.drafter import Gemma4AssistantDrafter

reference = pytest.importorskip("mlx_vlm.speculative.drafters.gemma4_assistant", reason="the parity extra: mlx-vlm")
mtp = pytest.importorskip("mlx_vlm.speculative.mtp")

pytestmark = pytest.mark.parity
K = 4
TOL = 1e-4
VARIANTS = {"tied": {}, "untied": {"tied": False}, "centroids": {"centroids": 7}}


def reference_draft(folder, target, context: list[int]) -> tuple[list[int], list[mx.array]]:
    """mlx-vlm's drafter over a fresh mlx-lm cache of context[:-1]: (tokens, [1, vocab] logits per step)."""
    cfg = json.loads((folder / "config.json").read_text())
    model = reference.Model(reference.ModelConfig.from_dict(cfg))
    weights = mx.load(str(folder / "model.safetensors"))
    model.load_weights(list(model.sanitize(weights).items()))
    model.bind(target.model)
    lm = target.model
    cache = lm.make_cache()  # mlx-lm's own: KVCache for full layers, RotatingKVCache for sliding ones
    hidden = lm.model(mx.array(context[:-1])[None], cache=cache)  # [1, n, H] after the final norm
    owners = SimpleNamespace(model=SimpleNamespace(layers=lm.model.layers[: len(cache)]))
    shared = mtp._mtp_shared_kv_from_prompt_cache(owners, cache)
    length = len(context) - 1
    model.set_shared_kv(shared, length, position=mtp._mtp_draft_position(length), kv_valid_len=length)
    seen = []

    def greedy(logits):
        seen.append(logits[0, -1][None].astype(mx.float32))
        return mx.argmax(logits[:, -1:, :], axis=-1).astype(mx.int32)

    tokens = model.draft_block(context[-1], hidden[:, -1:, :], None, K + 1, greedy)
    return tokens[0].tolist(), seen


def specpipe_draft(drafter, context: list[int]) -> tuple[list[int], list[mx.array]]:
    step = drafter._steps(context)
    tokens, logits, y = [], [], None
    for i in range(K):
        row = step(i, y)
        y = mx.argmax(row, axis=-1).astype(mx.uint32)
        tokens.append(int(y.item()))
        logits.append(row)
    return tokens, logits


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_draft_logits_equal_mlx_vlms(tmp_path, variant):
    target = tiny_gemma4()
    cfg = config(**VARIANTS[variant])
    folder = write(tmp_path / variant, cfg, random_weights(cfg, seed=7))
    drafter = Gemma4AssistantDrafter(target, str(folder))
    prompt = target.encode_prompt("the cat sat on the mat, the cat", chat=False)
    _, final, _, pipe = generate(target, drafter, 3, prompt, 12)
    assert final.stats.drafted > final.stats.accepted  # rollbacks ran before the compared step
    context = pipe.context
    assert len(context) < 64
    got_ids, got = specpipe_draft(drafter, context)
    want_ids, want = reference_draft(folder, target, context)
    diff = max(mx.abs(a - b).max().item() for a, b in zip(got, want))
    print(f"{variant}: max |logit diff| over {K} steps = {diff:.2e}")
    assert diff < TOL
    assert got_ids == want_ids
