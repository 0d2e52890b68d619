"""draft=dflash against the reference implementations on the same tiny random weights and inputs (`-m parity`).

References (test-only, the `parity` extra): z-lab's `dflash` 0.1.0 (`dflash/model_mlx.py`: `load_draft`,
`DFlashDraftModel`, and `_patch_model`'s hooks on the target's layer outputs), and bstnxbt's `dflash-mlx`
0.1.8 (`dflash_mlx/model.py`: `DFlashDraftModel` over a `FullContextDraftKVCache`). Both are MLX and run on
Linux CPU. Each reference reads the folder tests/dflash_tiny.py writes, taps its own copy of the target
(dflash) or is handed those taps (dflash-mlx), and drafts two blocks: one after the prompt, one after three
more tokens through its cached context. specpipe's logits must match to ATOL and its drafts exactly.
"""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from dflash_tiny import write_drafter

from specpipe.drafters.dflash.drafter import DFlashDrafter
from specpipe.engine.load.loader import load_engine

pytestmark = pytest.mark.parity

LAYERS = 6
ATOL = 1e-4  # float32 throughout; measured max abs diff up to 9.5e-6 (docs/verification.md)


def tiny_target(arch: str):
    return load_engine("tiny-random", precision="float32", arch=arch, seed=0, tiny={"num_hidden_layers": LAYERS})


def contexts(target) -> tuple[list[int], list[int]]:
    prompt = target.encode_prompt("the cat sat on the mat, the", chat=False)
    return prompt, [17, 40, 41]  # the second context: prompt + these (41 starts the second block)


def reference_dflash_blocks(folder, arch: str, monkeypatch) -> tuple[list[mx.array], mx.array]:
    """z-lab's draft over z-lab's own taps of a second copy of the target: (logits per block, first block's taps)."""
    model_mlx = pytest.importorskip("dflash.model_mlx")
    from mlx_lm.models.cache import make_prompt_cache

    monkeypatch.setattr(model_mlx, "snapshot_download", lambda *a, **k: str(folder))  # a local folder, no hub
    draft = model_mlx.load_draft("tiny")
    target = tiny_target(arch)  # its own copy: _patch_model replaces the layers it taps for good
    model = target.model
    model_mlx._patch_model(model, draft.config.target_layer_ids)
    draft.bind(model)
    prompt, more = contexts(target)
    target_cache, draft_cache = make_prompt_cache(model), make_prompt_cache(draft)
    mask = draft.config.mask_token_id
    blocks, first_taps = [], None
    # the reference's target has run every token but the block's first: the prompt, then t, a (b starts block 2)
    for feed, last in ((prompt[:-1], prompt[-1]), ([prompt[-1], *more[:2]], more[2])):
        model(mx.array([feed]), target_cache)
        hidden = mx.concatenate(model._hidden_states, axis=-1)
        first_taps = hidden if first_taps is None else first_taps
        block = mx.array([[last] + [mask] * (draft.config.block_size - 1)])
        blocks.append(draft(block, hidden, draft_cache, logits_start=1)[0].astype(mx.float32))
    return blocks, first_taps


def specpipe_blocks(folder, arch: str) -> tuple[list[mx.array], DFlashDrafter]:
    target = tiny_target(arch)
    prompt, more = contexts(target)
    drafter = DFlashDrafter(target, str(folder))
    return [drafter.block_logits(prompt), drafter.block_logits(prompt + more[:3])], drafter


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_block_logits_equal_z_lab_dflash(tmp_path, arch, monkeypatch):
    folder = write_drafter(tmp_path / "d", LAYERS, seed=5, target_layer_ids=[0, 2, 4], block_size=5)
    want, _ = reference_dflash_blocks(folder, arch, monkeypatch)
    got, _ = specpipe_blocks(folder, arch)
    for g, w in zip(got, want, strict=True):
        diff = mx.abs(g - w).max().item()
        print(f"dflash {arch}: max abs diff {diff:.2e}")
        assert diff < ATOL
        assert mx.argmax(g, -1).tolist() == mx.argmax(w, -1).tolist()  # the drafted tokens


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_block_logits_equal_dflash_mlx(tmp_path, arch):
    ref = pytest.importorskip("dflash_mlx.model")

    folder = write_drafter(tmp_path / "d", LAYERS, seed=6, block_size=4)
    args = ref.DFlashDraftModelArgs.from_dict(json.loads((folder / "config.json").read_text()))
    draft = ref.DFlashDraftModel(args)
    draft.load_weights(list(mx.load(str(folder / "model.safetensors")).items()))
    got, drafter = specpipe_blocks(folder, arch)
    target = drafter.target
    prompt, more = contexts(target)
    cache = [ref.FullContextDraftKVCache() for _ in draft.layers]
    embed, lm_head = drafter.inner.embed_tokens, drafter.lm_head
    # dflash-mlx is handed the taps (its own capture needs its Qwen/Gemma target backends): the same layer
    # outputs, as specpipe's tape holds them
    taps = drafter.tape.rows(0, len(prompt) + 2)
    spans = [(0, len(prompt) - 1, prompt[-1]), (len(prompt) - 1, len(prompt) + 2, more[2])]
    for i, (start, end, last) in enumerate(spans):
        block = mx.array([[last] + [args.dflash_config["mask_token_id"]] * (args.block_size - 1)])
        hidden = draft(noise_embedding=embed(block), target_hidden=taps[None, start:end], cache=cache)
        want = lm_head(hidden[:, 1:])[0].astype(mx.float32)
        diff = mx.abs(got[i] - want).max().item()
        print(f"dflash-mlx {arch}: max abs diff {diff:.2e}")
        assert diff < ATOL
        assert mx.argmax(got[i], -1).tolist() == mx.argmax(want, -1).tolist()


def test_specpipe_taps_are_the_layer_outputs_z_lab_hooks(tmp_path, monkeypatch):
    folder = write_drafter(tmp_path / "d", LAYERS, seed=7, target_layer_ids=[1, 5])  # 5: the last layer's output
    _, want = reference_dflash_blocks(folder, "llama", monkeypatch)
    _, drafter = specpipe_blocks(folder, "llama")
    got = drafter.tape.rows(0, want.shape[1])
    diff = mx.abs(got - want[0]).max().item()
    print(f"taps: max abs diff {diff:.2e}")
    assert diff < 1e-5
