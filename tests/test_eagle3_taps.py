"""Hidden-state taps through the engine seam (`Capture(layers=...)`, engine/layer_taps.py).

A tap at i is the residual stream entering decoder layer i (N: the last layer's output, before
the final norm); tapping changes no logit and leaves the model's layer list as mlx-lm built it.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from specpipe.engine import introspect
from specpipe.engine.engine import Capture
from specpipe.engine.layer_taps import default_layers
from specpipe.engine.load.loader import load_engine
from specpipe.errors import SpecpipeError

IDS = [3, 17, 101, 42, 7, 9]
LAYERS = 8


def deep(arch: str = "llama"):
    return load_engine("tiny-random", precision="float32", arch=arch, seed=0, tiny={"num_hidden_layers": LAYERS})


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_taps_are_the_inputs_of_the_chosen_layers_and_change_no_logit(arch):
    engine = deep(arch)
    inner, _ = introspect.llama_parts(engine.model, "eagle3")
    before = list(inner.layers)
    plain = engine.forward(IDS, engine.make_cache()).logits
    taps = (0, 1, 4, LAYERS)
    result = engine.forward(IDS, engine.make_cache(), capture=Capture(hidden=True, layers=taps))
    assert mx.array_equal(result.logits, plain).item()
    assert all(a is b for a, b in zip(inner.layers, before))  # every layer back in its slot
    assert introspect.foreign_modules(engine.model) == []
    h = inner.embed_tokens.weight.shape[1]
    assert result.layer_hidden.shape == (len(IDS), len(taps) * h)
    t0, t1, t4, tn = (result.layer_hidden[:, i * h : (i + 1) * h] for i in range(len(taps)))
    # the layers' own recurrence, run by hand without a cache
    x = inner.embed_tokens(mx.array(IDS, dtype=mx.uint32)[None])
    rows = [x[0]]
    for layer in inner.layers:
        x = layer(x, "causal", None)
        rows.append(x[0])
    for tapped, i in ((t0, 0), (t1, 1), (t4, 4), (tn, LAYERS)):
        assert mx.allclose(tapped, rows[i], atol=1e-5).item(), i
    assert mx.allclose(inner.norm(tn), result.hidden, atol=1e-5).item()  # N: just before the final norm


def test_prefill_taps_match_a_forward_in_chunks():
    engine = deep()
    engine.prefill_chunk = 4  # two chunks for six ids
    taps = default_layers(LAYERS)
    rows: list = []
    for _ in engine.prefill_steps(IDS, engine.make_cache(), Capture(layers=taps), layer_hidden=rows):
        pass
    assert [r.shape[0] for r in rows] == [4, 2]
    whole = engine.forward(IDS, engine.make_cache(), capture=Capture(layers=taps)).layer_hidden
    assert mx.allclose(mx.concatenate(rows), whole, atol=1e-5).item()


def test_eagle_default_taps():
    assert default_layers(32) == (2, 16, 29)  # Llama-3.1-8B: the inputs of layers 2, 16 and 29


def test_a_tap_outside_the_model_is_one_line():
    engine = deep()
    with pytest.raises(SpecpipeError, match=r"do not fit a target with 8 layers: .* in 0\.\.8") as err:
        engine.forward(IDS, None, capture=Capture(layers=(2, 9)))
    assert "\n" not in str(err.value)
    inner, _ = introspect.llama_parts(engine.model, "eagle3")
    assert introspect.foreign_modules(engine.model) == [] and len(inner.layers) == LAYERS
