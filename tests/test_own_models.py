"""Bringing your own model (issue 51): what a repo id that is not downloaded, a missing draft file,
`draft=model` without a draft, and a draft sharing few token ids say. Each refusal is one line naming
the key the user typed; the warning comes at start, with the share."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import tiny
from test_faults import ENV, error_line

from specpipe.advice import few_shared_tokens, warnings
from specpipe.cli.argv import validate_overrides
from specpipe.config.preflight import NO_DRAFT_MODEL


def specpipe(args: list[str], cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specpipe.cli", "prompt.text=hi", "max_tokens=2", *args],
        cwd=cwd,
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_repo_id_that_is_not_downloaded_says_how_to_download_it(tmp_path):
    env = {**ENV, "HF_HUB_CACHE": str(tmp_path / "hub")}
    proc = specpipe(["model.path=Qwen/Qwen2.5-0.5B-Instruct"], tmp_path, env)
    line = error_line(proc.stderr)
    assert proc.returncode == 1
    assert "model.path=Qwen/Qwen2.5-0.5B-Instruct is not downloaded" in line
    assert "`hf download Qwen/Qwen2.5-0.5B-Instruct`" in line and str(tmp_path / "hub") in line


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["draft.path=/no/such/draft.gguf"], "draft.path '/no/such/draft.gguf' does not exist"),
        (["draft.model=someorg/some-draft"], "draft.model=someorg/some-draft is not downloaded"),
        (["draft.model=no-such-model"], "unknown draft.model 'no-such-model'"),
    ],
)
def test_a_draft_that_cannot_be_found_names_the_draft_key(tmp_path, args, said):
    env = {**ENV, "HF_HUB_CACHE": str(tmp_path / "hub")}
    proc = specpipe(["model=tiny-random", "draft=model", *args], tmp_path, env)
    line = error_line(proc.stderr)
    assert said in line and "model.path" not in line, line


def test_draft_model_without_a_draft_is_refused_in_one_line(tmp_path):
    assert validate_overrides(["model=tiny-random", "draft=model"]) == NO_DRAFT_MODEL
    proc = specpipe(["model=tiny-random", "draft=model"], tmp_path)
    assert proc.returncode == 2 and NO_DRAFT_MODEL in error_line(proc.stderr)
    # self-drafting is still there, when asked for by name
    assert validate_overrides(["model=tiny-random", "experiment=self-draft"]) is None
    assert validate_overrides(["model=tiny-random", "draft=model", "draft.model=self"]) is None
    assert validate_overrides(["model=tiny-random", "draft=chain"]) is None  # the chain's model source: self


def test_a_draft_sharing_few_token_ids_is_warned_about_at_start(smollm2):
    """SmolLM2 drafted for by a byte-level model: a token map through 238 shared ids (0% accepted, issue 51)."""
    from specpipe.drafters.model import ModelDrafter
    from specpipe.engine.load.loader import load_engine

    drafter = ModelDrafter(target=smollm2, load=load_engine, model="tiny-random", quant="float32", vocab_map="text")
    assert drafter.token_map is not None
    line = few_shared_tokens(drafter)
    assert f"shares {drafter.token_map.shared} of the target's 49152 token ids (0.5%" in line
    assert line in warnings(smollm2, drafter, budget=None, mlx_device="cpu")
    same_family = ModelDrafter(target=tiny(), load=None, model="self")
    assert same_family.token_map is None and few_shared_tokens(same_family) == ""
