"""A drafter checkpoint that is cut, garbled or disagrees with itself is one line, not a traceback; a draft
model that soft-caps its logits keeps its whole head (a cut head would score without the cap)."""

from __future__ import annotations

import pytest
from dflash_tiny import config, random_weights, write, write_drafter

from specpipe.drafters.dflash.drafter import DFlashDrafter
from specpipe.drafters.eagle3.layouts import read_config as read_eagle3_config
from specpipe.drafters.gemma4_assistant.layout import load_assistant
from specpipe.engine.load.loader import load_engine
from specpipe.errors import SpecpipeError

LAYERS = 6


@pytest.fixture(scope="module")
def target():
    return load_engine("tiny-random", precision="float32", arch="llama", seed=0, tiny={"num_hidden_layers": LAYERS})


def test_a_dflash_head_whose_tensors_disagree_with_its_config_is_one_line(tmp_path, target):
    weights = random_weights(config(LAYERS))
    cfg = config(LAYERS)
    cfg["intermediate_size"] = 2 * cfg["intermediate_size"]  # the file's tensors were written for the other size
    folder = write(tmp_path / "d", cfg, weights)
    with pytest.raises(SpecpipeError, match="tensors disagree with its config.json") as err:
        DFlashDrafter(target, str(folder))
    assert "\n" not in str(err.value) and "mlp" in str(err.value)


@pytest.mark.parametrize("text", ["{", "[1, 2]", "\xff\xfe garbage"])
def test_a_garbled_config_json_is_one_line_for_every_published_layout(tmp_path, target, text):
    dflash = write_drafter(tmp_path / "dflash", LAYERS)
    eagle3, gemma = tmp_path / "eagle3", tmp_path / "gemma"
    for folder in (dflash, eagle3, gemma):
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(text, encoding="latin-1")
    for load in (lambda: DFlashDrafter(target, str(dflash)), lambda: read_eagle3_config(eagle3),
                 lambda: load_assistant(str(gemma))):  # fmt: skip
        with pytest.raises(SpecpipeError, match="config.json") as err:
            load()
        assert "\n" not in str(err.value)


def test_a_soft_capping_draft_model_keeps_its_whole_head():
    """gemma2 squashes its logits (tanh(x / cap) * cap); the cut head (draft.vocab) scores bare rows, so asked for
    one it says why in one line, and by default the draft keeps its whole head."""
    from specpipe.drafters.model import ModelDrafter

    gemma = load_engine("tiny-random", precision="float32", arch="gemma2", seed=0, tiny={"num_hidden_layers": 2})
    drafter = ModelDrafter.__new__(ModelDrafter)  # only its head choice is under test: no pipeline around it
    drafter.engine = gemma
    with pytest.raises(SpecpipeError, match="soft-caps its logits, which a cut head does not; use draft.vocab=0"):
        drafter._draft_vocab(64, target=None)
    assert drafter._draft_vocab(None, target=None) is None
