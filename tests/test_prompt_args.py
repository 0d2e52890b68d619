"""Prompt text through Hydra's override grammar: whatever the text, the composed config holds it unchanged."""

from __future__ import annotations

import io

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from specpipe.cli.prompt_args import PromptArgError, expand_prompt_args, hydra_quote


def _through_hydra(override: str) -> str:
    value = OverridesParser.create().parse_override(override).value()
    return OmegaConf.create({"text": value}).text  # OmegaConf resolves ${...} on access


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab $\\'\"{}(),=:#\n\tü€[]%") + ["${", "\\${", "\\'"]), max_size=30).map("".join))
def test_any_text_survives_hydra_and_omegaconf(text):
    assert _through_hydra("prompt.text=" + hydra_quote(text)) == text


def test_forms_become_one_quoted_override():
    assert expand_prompt_args(["model=x", "hello world"]) == ["model=x", "prompt.text='hello world'"]
    assert expand_prompt_args(["--prompt", "it's"]) == ["prompt.text='it\\'s'"]
    assert expand_prompt_args(["-"], stdin=io.StringIO("from stdin\n")) == ["prompt.text='from stdin\n'"]
    # Hydra's flags keep their values; overrides stay as typed.
    assert expand_prompt_args(["-cn", "config", "--cfg", "job", "budget.k=4"]) == [
        "-cn",
        "config",
        "--cfg",
        "job",
        "budget.k=4",
    ]
    assert expand_prompt_args(["-sc", "query=bash"]) == ["-sc", "query=bash"]
    # A single word is a prompt, not an override; ~key deletes a key.
    assert expand_prompt_args(["hello"]) == ["prompt.text='hello'"]
    assert expand_prompt_args(["~prompt.system"]) == ["~prompt.system"]


def test_unparsable_prompt_text_is_quoted_but_valid_quoting_is_kept():
    assert expand_prompt_args(["prompt.text=f(x)"]) == ["prompt.text='f(x)'"]
    assert expand_prompt_args(["prompt.text='a, b'"]) == ["prompt.text='a, b'"]
    assert expand_prompt_args(["prompt.system=Be brief, please"]) == ["prompt.system='Be brief, please'"]
    # In a sweep a comma means several values: left to Hydra.
    assert expand_prompt_args(["-m", "prompt.text=a,b"]) == ["-m", "prompt.text=a,b"]


def test_stdin_from_a_terminal_is_refused():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    with pytest.raises(PromptArgError, match="stdin is a terminal"):
        expand_prompt_args(["-"], stdin=Tty())
