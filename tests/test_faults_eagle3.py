"""draft=eagle3's bad inputs through the real command line: one line on stderr, exit 1, nothing generated
(docs/faults.md; the loader's messages themselves are tests/test_eagle3_head.py's)."""

from __future__ import annotations

import json

import pytest
from eagle3_tiny import head_config, random_weights, write
from test_faults import error_line, run_cli

DEEP = ["model=tiny-random", "+model.tiny.num_hidden_layers=8", "draft=eagle3", "max_tokens=4", "prompt.text=hi"]


def folders(tmp_path):
    cfg = head_config()
    good = write(tmp_path / "good", "speculators", cfg, random_weights(cfg))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    wide_cfg = head_config(target_hidden_size=32)
    wide = write(tmp_path / "wide", "eagle", wide_cfg, random_weights(wide_cfg))
    return {"good": good, "plain": plain, "wide": wide, "empty": tmp_path}


@pytest.mark.parametrize(
    "case, extra, words",
    [
        ("none", [], "draft=eagle3 needs the head's folder"),
        ("plain", [], "has architectures 'LlamaForCausalLM' and no draft_vocab_size or speculators_model_type"),
        ("wide", [], "fuses 3 taps of width 32, the target gives 3 of width 64"),
        ("good", ["draft.layers=[2,4,9]"], "do not fit a target with 8 layers"),
    ],
)
def test_a_folder_in_no_known_layout_or_for_another_target_is_one_line(tmp_path, case, extra, words):
    paths = folders(tmp_path)
    path = [f"draft.path={paths[case]}"] if case != "none" else []
    proc = run_cli([*DEEP, *path, *extra, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert words in error_line(proc.stderr)
    assert proc.stdout == ""  # nothing generated
