"""specpipe-train-drafter kind=eagle3 on a tiny random llama: it writes a speculators-layout head that
draft=eagle3 loads (its layout, taps and reduced vocabulary), decoding with it equals draft=none, a
resumed run equals a straight one, and training lowers the loss."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from conftest import CONF_DIR, generate, make_drafter
from hydra import compose, initialize_config_dir

import specpipe.config.schema  # noqa: F401  (registers the schemas)
from specpipe.drafters.eagle3.drafter import Eagle3Drafter
from specpipe.engine.load.loader import load_engine
from specpipe.errors import SpecpipeError
from specpipe.train.drafter import train

LAYERS = 8


def overrides(tmp_path, out: str, *extra: str) -> list[str]:
    corpus = tmp_path / "corpus.py"
    if not corpus.exists():
        corpus.write_text("def add(a, b):\n    return a + b\n\n# the cat sat on the mat\n" * 60)
    return [
        "kind=eagle3",
        "model=tiny-random",
        f"+model.tiny.num_hidden_layers={LAYERS}",
        f"corpus={corpus}",
        f"out={tmp_path / out}",
        "sequences=6",
        "batch=2",
        "seq_len=32",
        "chunk=3",
        "save_every=2",
        "warmup=1",
        "lr=3e-3",
        "draft_vocab=64",
        "unroll=2",
        "hydra.run.dir=.",
        *extra,
    ]


def composed(args: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name="train_drafter", overrides=args)


def test_a_trained_head_loads_as_draft_eagle3_and_decodes_losslessly(tmp_path):
    train(composed(overrides(tmp_path, "head", "steps=2", "resume=false")))
    meta = json.loads((tmp_path / "head" / "specpipe_train.json").read_text())
    assert meta["steps"] == 2 and meta["taps"] == [2, 4, 5]
    train(composed(overrides(tmp_path, "head", "steps=6")))  # picks up at step 2
    train(composed(overrides(tmp_path, "again", "steps=6", "resume=false")))  # the same seed, straight through
    a = mx.load(str(tmp_path / "head" / "model.safetensors"))
    b = mx.load(str(tmp_path / "again" / "model.safetensors"))
    assert set(a) == set(b) and "embed_tokens.weight" not in a and a["d2t"].shape == (64,)
    assert all(mx.allclose(a[k].astype(mx.float32), b[k].astype(mx.float32), atol=1e-5).item() for k in a)
    first = json.loads((tmp_path / "again" / "specpipe_train.json").read_text())
    assert json.loads((tmp_path / "head" / "specpipe_train.json").read_text())["steps"] == first["steps"] == 6

    target = load_engine("tiny-random", precision="float32", arch="llama", seed=0, tiny={"num_hidden_layers": LAYERS})
    drafter = Eagle3Drafter(target, str(tmp_path / "head"))
    assert drafter.source.layout == "speculators" and drafter.layers == (2, 4, 5)
    assert drafter.head.cfg.draft_vocab_size == 64
    prompt = target.encode_prompt("def add(a, b):\n    return", chat=False)
    baseline = generate(target, make_drafter("none", target), 1, prompt, 24)[0]
    got, final, _, _ = generate(target, drafter, 4, prompt, 24)
    assert got == baseline and drafter.target_recomputes == 0


def test_training_lowers_the_loss(tmp_path):
    train(composed(overrides(tmp_path, "short", "steps=1", "resume=false")))
    train(composed(overrides(tmp_path, "long", "steps=40", "save_every=40", "resume=false")))
    loss = lambda name: json.loads((tmp_path / name / "specpipe_train.json").read_text())["loss"]  # noqa: E731
    assert loss("long") < 0.8 * loss("short"), (loss("short"), loss("long"))


def test_a_bad_kind_is_one_line(tmp_path):
    with pytest.raises(SpecpipeError, match="trains kind=mtp or kind=eagle3") as err:
        train(composed(overrides(tmp_path, "x", "steps=1", "kind=dflash")))
    assert "\n" not in str(err.value)
