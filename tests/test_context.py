"""A run that would pass the model's context is refused before the first forward, in one line naming
the numbers and the way out: the real SmolLM2 (context 8192, its own tokenizer) through the CLI and
the engine, and a tiny model with a 48-position context through a Session (kv=window lifts the
prompt-plus-answer limit and then generates past it)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module

import specpipe.config.schema  # noqa: F401  (registers the schemas the YAML extends)
from specpipe.engine.context import check_room, overflow_message
from specpipe.engine.kv import WindowKV
from specpipe.errors import SpecpipeError
from specpipe.events import RunFinished
from specpipe.run.session import Session

TINY_CONTEXT = 48


def tiny_session(*overrides: str) -> Session:
    base = ["model=tiny-random", f"+model.tiny.max_position_embeddings={TINY_CONTEXT}", "draft=ngram", "budget.k=4"]
    with initialize_config_module(config_module="specpipe.conf", version_base=None):
        return Session(compose(config_name="config", overrides=[*base, *overrides]))


def finished(events) -> RunFinished:
    return [e for e in events if isinstance(e, RunFinished)][-1]


def test_smollm2_context_is_read_from_its_gguf(smollm2):
    assert smollm2.context_length == 8192


def test_prompt_plus_max_tokens_past_the_context_names_both_numbers(smollm2):
    assert overflow_message(smollm2, 8000, 192) is None  # 8192 exactly: fits
    message = overflow_message(smollm2, 8000, 256)
    assert message is not None and "\n" not in message
    for words in ("8000 tokens", "max_tokens=256", "8192", "max_tokens=192 or less", "kv=window"):
        assert words in message


def test_a_prompt_alone_past_the_context_is_refused_even_with_a_window(smollm2):
    saved = smollm2.kv
    try:
        smollm2.kv = WindowKV(size=1024)
        assert overflow_message(smollm2, 8000, 4096) is None  # a window generates past the context
        with pytest.raises(SpecpipeError, match="the prompt is 8192 tokens but .* context is 8192 tokens"):
            check_room(smollm2, 8192, 1)
    finally:
        smollm2.kv = saved


def test_cli_refuses_a_long_file_prompt_in_one_line_before_prefill(tmp_path, smollm2_gguf, smollm2):
    words = " ".join(f"w{i}" for i in range(3000))  # the real tokenizer makes well over 8192 tokens of it
    n = len(smollm2.encode_prompt(words, chat=True))
    assert n > 8192
    (tmp_path / "doc.txt").write_text(words)
    proc = subprocess.run(
        [sys.executable, "-m", "specpipe.cli", "prompt.file=doc.txt", "draft=ngram", "max_tokens=16"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and f"the prompt is {n} tokens" in lines[0] and "8192" in lines[0]
    assert "Traceback" not in proc.stderr and "prefill" not in proc.stderr.lower()


def test_tiny_session_refuses_then_fits_then_windows_past_the_context():
    session = tiny_session()
    prompt = session.target.encode_prompt("ab ab ab ab ab ab ab ab ab ab", chat=False)  # 29 byte tokens
    room = TINY_CONTEXT - len(prompt)
    with pytest.raises(SpecpipeError, match=f"max_tokens={room} or less"):
        session.generate(prompt, max_tokens=room + 1)
    assert len(finished(session.generate(prompt, max_tokens=room)).token_ids) <= room

    windowed = tiny_session("kv=window", "kv.size=16")
    end = finished(windowed.generate(prompt, max_tokens=room + 8))
    assert len(end.token_ids) == room + 8 and len(prompt) + len(end.token_ids) > TINY_CONTEXT
